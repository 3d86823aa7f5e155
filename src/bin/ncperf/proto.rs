//! What an ncperf client and server say to each other on one connection: the library's
//! [`netchannel::perf_proto`], shared with the benches' remote-peer mode.

pub use netchannel::perf_proto::*;

#[cfg(test)]
use std::io;
#[cfg(test)]
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_refusals() {
        for op in [Op::Echo, Op::Sink, Op::OneShot] {
            assert_eq!(parse_hello(&hello(op, 4096)), Some((op, 4096)));
        }
        let mut bad = hello(Op::Echo, 0);
        bad[0] = b'X';
        assert_eq!(parse_hello(&bad), None);
        let mut bad_op = hello(Op::Echo, 0);
        bad_op[4] = 9;
        assert_eq!(parse_hello(&bad_op), None);
    }

    #[test]
    fn sink_report_round_trip() {
        for r in [
            SinkReport {
                bytes: 0,
                intact: true,
            },
            SinkReport {
                bytes: u64::MAX - 3,
                intact: false,
            },
        ] {
            assert_eq!(SinkReport::decode(&r.encode()), r);
        }
    }

    #[test]
    fn pattern_pieces_join_up_and_a_shifted_byte_is_caught() {
        let p = Pattern::new();
        // The stream read in odd-sized pieces is the stream written in blocks.
        let mut written = Vec::new();
        let mut off = 0u64;
        while written.len() < 3 * Pattern::PERIOD {
            written.extend_from_slice(p.at(off, BLOCK));
            off += BLOCK as u64;
        }
        let mut at = 0usize;
        for piece in [1, 7, 4093, 65_536, 100_000, 1] {
            assert!(
                p.check(at as u64, &written[at..at + piece]),
                "piece at {at}"
            );
            at += piece;
        }
        // The same bytes one offset off fail.
        assert!(!p.check(1, &written[..4096]));
        let mut corrupt = written[..BLOCK].to_vec();
        corrupt[BLOCK - 1] ^= 1;
        assert!(!p.check(0, &corrupt));
    }

    #[tokio::test]
    async fn server_ops_over_an_in_memory_pipe() {
        let p = Pattern::new();
        // Echo.
        let (mut c, s) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { serve(s, &Pattern::new()).await });
        c.write_all(&hello(Op::Echo, 0)).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        c.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        c.shutdown().await.unwrap();
        assert_eq!(server.await.unwrap().unwrap(), 4);

        // Sink: a good stream, then one with a wrong byte.
        for corrupt in [false, true] {
            let (mut c, s) = tokio::io::duplex(1 << 16);
            let server = tokio::spawn(async move { serve(s, &Pattern::new()).await });
            c.write_all(&hello(Op::Sink, 0)).await.unwrap();
            let mut data = p.at(0, 5000).to_vec();
            if corrupt {
                data[4000] ^= 0x80;
            }
            c.write_all(&data).await.unwrap();
            c.shutdown().await.unwrap();
            let mut r = [0u8; REPORT_LEN];
            c.read_exact(&mut r).await.unwrap();
            assert_eq!(
                SinkReport::decode(&r),
                SinkReport {
                    bytes: 5000,
                    intact: !corrupt
                }
            );
            server.await.unwrap().unwrap();
        }

        // One shot: the server answers and closes first.
        let (mut c, s) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { serve(s, &Pattern::new()).await });
        c.write_all(&hello(Op::OneShot, 3)).await.unwrap();
        c.write_all(b"abc").await.unwrap();
        let mut all = Vec::new();
        c.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"abc");
        server.await.unwrap().unwrap();

        // Not a hello.
        let (mut c, s) = tokio::io::duplex(64);
        let server = tokio::spawn(async move { serve(s, &Pattern::new()).await });
        c.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let err = server.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
