//! A tonic gRPC service and its client on netchannel: `echo.Echo` with a unary method
//! (`Say`: the message back), a server-streaming one (`Count`: the numbers 1..=n) and a
//! client-streaming one (`Sum`: the sum of the numbers sent).
//!
//! The server takes a `VirtualListener`'s connections through
//! `Server::serve_with_incoming(listener.incoming())`; the client's channel opens virtual
//! streams through `Endpoint::connect_with_connector(VirtualConnector::new(stack))`
//! (cargo feature `tonic`). The messages are prost messages written by hand and the
//! service's routing is tonic's generated code in the small, so the example builds
//! without `protoc` (the `.proto` it implements is in the comment below).
//!
//! ```text
//! cargo run --example grpc --features tonic -- --interface vA --ipv4 10.77.0.1 --listen 50051
//! cargo run --example grpc --features tonic -- --interface vB --ipv4 10.77.0.2 \
//!     --connect 10.77.0.1:50051 --count 5
//! ```
//!
//! ```proto
//! syntax = "proto3";
//! package echo;
//! service Echo {
//!   rpc Say (EchoRequest) returns (EchoReply);
//!   rpc Count (CountRequest) returns (stream Number);
//!   rpc Sum (stream Number) returns (Number);
//! }
//! message EchoRequest { string message = 1; }
//! message EchoReply { string message = 1; string peer = 2; }
//! message CountRequest { uint32 n = 1; }
//! message Number { uint64 value = 1; }
//! ```
//!
//! Needs root (AF_XDP). The server stops on SIGINT/SIGTERM.

mod support;

use std::process::ExitCode;

use clap::Parser;

/// A gRPC server or client on netchannel.
#[derive(Parser, Debug)]
struct Args {
    /// Interface for the stack's AF_XDP sockets.
    #[arg(long, value_name = "IFACE")]
    interface: String,
    /// The stack's IPv4 address on that interface.
    #[arg(long, value_name = "ADDR")]
    ipv4: std::net::Ipv4Addr,
    /// Serve on this port.
    #[arg(long, value_name = "PORT", conflicts_with = "connect")]
    listen: Option<u16>,
    /// Call the service at this address.
    #[arg(long, value_name = "ADDR:PORT")]
    connect: Option<std::net::SocketAddr>,
    /// How many numbers the client asks `Count` for and sends `Sum`.
    #[arg(long, default_value_t = 10)]
    count: u32,
}

/// The messages, as prost would generate them from the `.proto` above.
mod proto {
    /// `Say`'s request.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EchoRequest {
        #[prost(string, tag = "1")]
        pub message: String,
    }
    /// `Say`'s reply: the message and the caller's address as the server saw it.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EchoReply {
        #[prost(string, tag = "1")]
        pub message: String,
        #[prost(string, tag = "2")]
        pub peer: String,
    }
    /// `Count`'s request.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CountRequest {
        #[prost(uint32, tag = "1")]
        pub n: u32,
    }
    /// A number of a stream.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Number {
        #[prost(uint64, tag = "1")]
        pub value: u64,
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    #[cfg(target_os = "linux")]
    let result = linux::run(args);
    #[cfg(not(target_os = "linux"))]
    let result: Result<(), String> = {
        let _ = args;
        Err("AF_XDP is Linux only".to_string())
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("grpc: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::net::{SocketAddr, SocketAddrV4};
    use std::pin::Pin;

    use netchannel::ecosystem::hyper::VirtualConnector;
    use netchannel::Stack;
    use tokio_stream::{Stream, StreamExt};
    use tonic::codegen::{http, BoxFuture, Context, Poll, Service, StdError};
    use tonic::server::{
        ClientStreamingService, NamedService, ServerStreamingService, UnaryService,
    };
    use tonic::transport::{Endpoint, Server};
    use tonic::{Request, Response, Status, Streaming};
    use tonic_prost::ProstCodec;

    use super::proto::{CountRequest, EchoReply, EchoRequest, Number};
    use super::Args;
    use crate::support::{build_stack, error_chain, stop_on_signals, stopped};

    pub fn run(args: Args) -> Result<(), String> {
        let stop = stop_on_signals("grpc").map_err(|e| e.to_string())?;
        let stack = build_stack(&args.interface, args.ipv4, None).map_err(|e| e.to_string())?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let result = match (args.listen, args.connect) {
            (Some(port), _) => rt.block_on(async {
                let mut stop = stop;
                let addr = SocketAddrV4::new(stack.ipv4(), port);
                let listener = stack.bind(addr.into()).await.map_err(|e| e.to_string())?;
                println!(
                    "grpc server: netchannel on {} ({}), channel port 9000, listening on port {port}",
                    args.interface, args.ipv4
                );
                Server::builder()
                    .add_service(EchoServer)
                    .serve_with_incoming_shutdown(listener.incoming(), stopped(&mut stop))
                    .await
                    .map_err(|e| error_chain(&e))?;
                println!("grpc server: stopped");
                Ok(())
            }),
            (None, Some(to)) => rt.block_on(client(&stack, to, args.count)),
            (None, None) => Err("give --listen PORT or --connect ADDR:PORT".into()),
        };
        stack.abort();
        result
    }

    async fn client(stack: &Stack, to: SocketAddr, count: u32) -> Result<(), String> {
        let err = |e: &dyn std::error::Error| error_chain(e);
        let channel = Endpoint::from_shared(format!("http://{to}"))
            .map_err(|e| err(&e))?
            .connect_with_connector(VirtualConnector::new(stack.clone()))
            .await
            .map_err(|e| err(&e))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        let path = |p: &'static str| http::uri::PathAndQuery::from_static(p);

        grpc.ready().await.map_err(|e| err(&e))?;
        let reply: Response<EchoReply> = grpc
            .unary(
                Request::new(EchoRequest {
                    message: "hello over netchannel".into(),
                }),
                path("/echo.Echo/Say"),
                ProstCodec::default(),
            )
            .await
            .map_err(|e| err(&e))?;
        let reply = reply.into_inner();
        println!(
            "grpc client: Say: {:?} (the server saw us as {})",
            reply.message, reply.peer
        );

        grpc.ready().await.map_err(|e| err(&e))?;
        let numbers: Response<Streaming<Number>> = grpc
            .server_streaming(
                Request::new(CountRequest { n: count }),
                path("/echo.Echo/Count"),
                ProstCodec::default(),
            )
            .await
            .map_err(|e| err(&e))?;
        let mut numbers = numbers.into_inner();
        let mut got = Vec::new();
        while let Some(n) = numbers.message().await.map_err(|e| err(&e))? {
            got.push(n.value);
        }
        if got != (1..=u64::from(count)).collect::<Vec<_>>() {
            return Err(format!("Count({count}) streamed {got:?}"));
        }
        println!(
            "grpc client: Count({count}): {} numbers in order",
            got.len()
        );

        grpc.ready().await.map_err(|e| err(&e))?;
        let sent = tokio_stream::iter((1..=u64::from(count)).map(|value| Number { value }));
        let sum: Response<Number> = grpc
            .client_streaming(
                Request::new(sent),
                path("/echo.Echo/Sum"),
                ProstCodec::default(),
            )
            .await
            .map_err(|e| err(&e))?;
        let want = u64::from(count) * (u64::from(count) + 1) / 2;
        let sum = sum.into_inner().value;
        if sum != want {
            return Err(format!("Sum of 1..={count}: {sum}, want {want}"));
        }
        println!("grpc client: Sum(1..={count}) = {sum}");
        Ok(())
    }

    /// The service, routed by path as tonic-build's generated servers are.
    #[derive(Clone, Copy, Debug)]
    struct EchoServer;

    impl NamedService for EchoServer {
        const NAME: &'static str = "echo.Echo";
    }

    struct Say;
    impl UnaryService<EchoRequest> for Say {
        type Response = EchoReply;
        type Future = BoxFuture<Response<EchoReply>, Status>;
        fn call(&mut self, request: Request<EchoRequest>) -> Self::Future {
            Box::pin(async move {
                // `Connected` for VirtualStream gives tonic the peer's address.
                let peer = request
                    .remote_addr()
                    .map_or_else(|| "unknown".to_string(), |a| a.to_string());
                println!("grpc server: Say from {peer}");
                Ok(Response::new(EchoReply {
                    message: request.into_inner().message,
                    peer,
                }))
            })
        }
    }

    type NumberStream = Pin<Box<dyn Stream<Item = Result<Number, Status>> + Send>>;

    struct Count;
    impl ServerStreamingService<CountRequest> for Count {
        type Response = Number;
        type ResponseStream = NumberStream;
        type Future = BoxFuture<Response<NumberStream>, Status>;
        fn call(&mut self, request: Request<CountRequest>) -> Self::Future {
            Box::pin(async move {
                let n = request.into_inner().n;
                if n > 1_000_000 {
                    return Err(Status::invalid_argument("at most 1,000,000 numbers"));
                }
                let stream =
                    tokio_stream::iter((1..=u64::from(n)).map(|value| Ok(Number { value })));
                Ok(Response::new(Box::pin(stream) as NumberStream))
            })
        }
    }

    struct Sum;
    impl ClientStreamingService<Number> for Sum {
        type Response = Number;
        type Future = BoxFuture<Response<Number>, Status>;
        fn call(&mut self, request: Request<Streaming<Number>>) -> Self::Future {
            Box::pin(async move {
                let mut numbers = request.into_inner();
                let mut sum = 0u64;
                while let Some(n) = numbers.next().await {
                    sum = sum.wrapping_add(n?.value);
                }
                Ok(Response::new(Number { value: sum }))
            })
        }
    }

    impl<B> Service<http::Request<B>> for EchoServer
    where
        B: tonic::codegen::Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = BoxFuture<Self::Response, Self::Error>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<B>) -> Self::Future {
            match req.uri().path() {
                "/echo.Echo/Say" => Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                    Ok(grpc.unary(Say, req).await)
                }),
                "/echo.Echo/Count" => Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                    Ok(grpc.server_streaming(Count, req).await)
                }),
                "/echo.Echo/Sum" => Box::pin(async move {
                    let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                    Ok(grpc.client_streaming(Sum, req).await)
                }),
                _ => {
                    Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) })
                }
            }
        }
    }
}
