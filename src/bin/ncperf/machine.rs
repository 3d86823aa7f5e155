//! What the report says about the machine: cores, CPU, kernel, and each interface's
//! driver, queues, MTU and addresses (`ip -d -j addr`, `ethtool -i`, `ethtool -l`, run
//! inside the interface's namespace when it has one).

use std::process::Command;

use crate::report::{Interface, Machine};

/// The machine, with the interfaces `ifaces` (role, name, namespace).
pub fn machine(ifaces: &[(&str, &str, Option<&str>)]) -> Machine {
    let uts = nix::sys::utsname::uname().ok();
    Machine {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        cpu: std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default(),
        kernel: uts
            .as_ref()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        hostname: uts
            .as_ref()
            .map(|u| u.nodename().to_string_lossy().into_owned())
            .unwrap_or_default(),
        interfaces: ifaces
            .iter()
            .map(|&(role, name, netns)| interface(role, name, netns))
            .collect(),
    }
}

/// `program args…`, inside `netns` when given; its standard output, or `None`.
fn output(netns: Option<&str>, program: &str, args: &[&str]) -> Option<String> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
        None => Command::new(program),
    };
    let out = cmd.args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One interface's facts; fields it cannot learn stay empty or zero.
pub fn interface(role: &str, name: &str, netns: Option<&str>) -> Interface {
    let mut i = Interface {
        role: role.to_string(),
        name: name.to_string(),
        netns: netns.map(str::to_string),
        ..Interface::default()
    };
    if let Some(json) = output(netns, "ip", &["-d", "-j", "addr", "show", "dev", name]) {
        parse_ip_addr(&json, &mut i);
    }
    if let Some(text) = output(netns, "ethtool", &["-i", name]) {
        i.driver = parse_driver(&text);
    }
    if let Some(text) = output(netns, "ethtool", &["-l", name]) {
        if let Some((rx, tx)) = parse_channels(&text) {
            i.rx_queues = rx;
            i.tx_queues = tx;
        }
    }
    i
}

/// Fills MTU, queue counts and IPv4 addresses from `ip -d -j addr show dev X`.
fn parse_ip_addr(json: &str, i: &mut Interface) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return;
    };
    let Some(link) = v.get(0) else { return };
    let num = |k: &str| link.get(k).and_then(|x| x.as_u64()).unwrap_or(0) as u32;
    i.mtu = num("mtu");
    i.rx_queues = num("num_rx_queues");
    i.tx_queues = num("num_tx_queues");
    if let Some(addrs) = link.get("addr_info").and_then(|a| a.as_array()) {
        i.ipv4 = addrs
            .iter()
            .filter(|a| a.get("family").and_then(|f| f.as_str()) == Some("inet"))
            .filter_map(|a| {
                Some(format!(
                    "{}/{}",
                    a.get("local")?.as_str()?,
                    a.get("prefixlen")?.as_u64()?
                ))
            })
            .collect();
    }
}

/// The `driver:` line of `ethtool -i`.
fn parse_driver(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("driver:"))
        .map(|d| d.trim().to_string())
        .unwrap_or_default()
}

/// The queues in use from `ethtool -l`'s current settings: rx and tx, each plus the
/// combined channels.
fn parse_channels(text: &str) -> Option<(u32, u32)> {
    let current = text.split("Current hardware settings:").nth(1)?;
    let get = |key: &str| -> u32 {
        current
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let combined = get("Combined:");
    let (rx, tx) = (get("RX:") + combined, get("TX:") + combined);
    (rx > 0 && tx > 0).then_some((rx, tx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ip_json_ethtool_driver_and_channels() {
        let json = r#"[{"ifindex":7,"ifname":"vB","mtu":1500,"num_tx_queues":4,
            "num_rx_queues":4,"addr_info":[{"family":"inet","local":"10.77.0.2",
            "prefixlen":24},{"family":"inet6","local":"fe80::1","prefixlen":64}]}]"#;
        let mut i = Interface::default();
        parse_ip_addr(json, &mut i);
        assert_eq!((i.mtu, i.rx_queues, i.tx_queues), (1500, 4, 4));
        assert_eq!(i.ipv4, vec!["10.77.0.2/24".to_string()]);
        assert_eq!(
            parse_driver("driver: mlx5_core\nversion: 6.8\n"),
            "mlx5_core"
        );
        let veth = "Channel parameters for vB:\nPre-set maximums:\nRX:\t\t4\nTX:\t\t4\n\
                    Other:\t\tn/a\nCombined:\tn/a\nCurrent hardware settings:\nRX:\t\t2\n\
                    TX:\t\t2\nOther:\t\tn/a\nCombined:\tn/a\n";
        assert_eq!(parse_channels(veth), Some((2, 2)));
        let nic = "Pre-set maximums:\nRX:\t\tn/a\nTX:\t\tn/a\nCombined:\t63\n\
                   Current hardware settings:\nRX:\t\tn/a\nTX:\t\tn/a\nCombined:\t8\n";
        assert_eq!(parse_channels(nic), Some((8, 8)));
        assert_eq!(parse_channels("nonsense"), None);
    }
}
