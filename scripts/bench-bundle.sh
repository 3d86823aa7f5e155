#!/usr/bin/env bash
# Benchmarks on a machine without a Rust toolchain (a 16-core machine, say: see
# docs/investigations/sixteen-cores.md).
#
#   scripts/bench-bundle.sh make [BENCH...]   here: build the release benches (default
#                                             rpc_rate operating_points vns_latency) and
#                                             put them, stripped, into .devbundle/ with
#                                             every shared library they and `ip`/`ethtool`
#                                             load, the dynamic loader included (and
#                                             `perf`, where this machine has it);
#   scripts/bench-bundle.sh run BENCH [ARG...]   there: run one bundled bench through the
#                                             bundled loader, with the bundled `ip`,
#                                             `ethtool` (the test bed calls them) and
#                                             `perf` first on PATH, `--bench` added.
#
# The loader and libc travel too, so the bundle does not depend on the other machine's C
# library version. `.devbundle/` is meant to be ignored (`.git/info/exclude`) and carried.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle="$PWD/.devbundle"

libs_of() {
    # Every library `ldd` resolves for the given executables, and the loader.
    ldd "$@" 2>/dev/null | awk '/=> \// { print $3 } $1 ~ /ld-linux/ { print $1 }' | sort -u
}

case "${1:-}" in
make)
    shift
    benches=("$@")
    [ ${#benches[@]} -gt 0 ] || benches=(rpc_rate operating_points vns_latency)
    args=()
    for b in "${benches[@]}"; do args+=(--bench "$b"); done
    out=$(cargo bench --no-run -j2 "${args[@]}" --message-format=json 2>/dev/null |
        python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])')
    rm -rf "$bundle"
    mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/tools" "$bundle/path"
    exes=()
    while read -r name exe; do
        # Symbols stay (for `perf report`); debug information goes, or with
        # BUNDLE_DEBUG=1 stays compressed (for `perf record --call-graph dwarf`).
        if [ "${BUNDLE_DEBUG:-0}" = 1 ]; then
            objcopy --compress-debug-sections=zlib "$exe" "$bundle/bin/$name"
        else
            strip --strip-debug -o "$bundle/bin/$name" "$exe"
        fi
        exes+=("$exe")
    done <<<"$out"
    tools=(ip ethtool)
    # perf, where this machine has it, for profiles there (it may have none).
    if command -v perf >/dev/null; then tools+=(perf); fi
    for t in "${tools[@]}"; do
        cp "$(command -v "$t")" "$bundle/tools/$t"
        exes+=("$(command -v "$t")")
        cat >"$bundle/path/$t" <<EOF
#!/bin/sh
b=\$(dirname "\$(dirname "\$(readlink -f "\$0")")")
exec "\$b/lib/ld-linux-x86-64.so.2" --library-path "\$b/lib" "\$b/tools/$t" "\$@"
EOF
        chmod +x "$bundle/path/$t"
    done
    for l in $(libs_of "${exes[@]}"); do cp -L "$l" "$bundle/lib/"; done
    du -sh "$bundle"
    ls "$bundle/bin"
    ;;
run)
    shift
    name=${1:?which bench}
    shift
    export PATH="$bundle/path:$PATH"
    exec "$bundle/lib/ld-linux-x86-64.so.2" --library-path "$bundle/lib" "$bundle/bin/$name" --bench "$@"
    ;;
*)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac
