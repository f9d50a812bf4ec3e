//! `vgpu daemon --listen`: the forms an operator writes (`:9396`,
//! `localhost:9396`, `10.0.0.5:9396`, `[::1]:9396`) and the sockets they
//! become. A host name is resolved once, at startup, and every address it
//! names is served, so `localhost` answers on 127.0.0.1 and ::1 alike.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs as _};
use std::str::FromStr;

use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};

/// Pending connections the kernel queues per socket (std's default).
const BACKLOG: i32 = 128;

/// Where to serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// `:PORT`: every interface, IPv4 and, where the node has it, IPv6.
    AllInterfaces(u16),
    /// `IP:PORT` or `[IPv6]:PORT`.
    Addr(SocketAddr),
    /// `HOST:PORT`: every address the name resolves to.
    Host(String, u16),
}

/// `--listen` cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("{0:?} has no port: write HOST:PORT, :PORT or [IPv6]:PORT")]
    NoPort(String),
    #[error("{port:?} is not a port number (0-65535)")]
    Port { port: String },
    #[error("{0:?} is an IPv6 address without brackets: write [{0}]:PORT")]
    BareIpv6(String),
    #[error("{0:?} is not a host name")]
    Host(String),
}

/// The sockets for a [`Listen`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} resolves to no address")]
    NoAddress(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl FromStr for Listen {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(Listen::Addr(a));
        }
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| ParseError::NoPort(s.to_owned()))?;
        if host.parse::<Ipv6Addr>().is_ok() || host.contains(':') {
            return Err(ParseError::BareIpv6(host.to_owned()));
        }
        let port = port.parse::<u16>().map_err(|_| ParseError::Port {
            port: port.to_owned(),
        })?;
        if host.is_empty() {
            return Ok(Listen::AllInterfaces(port));
        }
        // A name as DNS spells one; an IP-looking string that did not parse
        // above (`10.0.0.300`) is refused rather than looked up.
        let name_like = host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            && host.bytes().any(|b| b.is_ascii_alphabetic());
        if !name_like || host.len() > 253 {
            return Err(ParseError::Host(host.to_owned()));
        }
        Ok(Listen::Host(host.to_owned(), port))
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::AllInterfaces(p) => write!(f, ":{p}"),
            Listen::Addr(a) => write!(f, "{a}"),
            Listen::Host(h, p) => write!(f, "{h}:{p}"),
        }
    }
}

impl Listen {
    /// Binds every socket this names (non-blocking), so a taken port is an
    /// error at startup, not later.
    pub fn bind(&self) -> Result<Vec<TcpListener>, BindError> {
        let out = match self {
            Listen::Addr(a) => vec![bind_std(*a)?],
            Listen::AllInterfaces(port) => {
                let v4 = bind_std((Ipv4Addr::UNSPECIFIED, *port).into())?;
                // The IPv6 socket takes the port the IPv4 one got (`:0`), and
                // only IPv6: IPv4 clients keep their own addresses, whatever
                // the node's net.ipv6.bindv6only.
                let port = local_port(&v4, *port);
                let v6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
                match bind_v6_only(v6) {
                    Ok(l) => vec![v4, l],
                    Err(e) if no_such_address(&e) => {
                        tracing::info!("no IPv6 on this node; serving IPv4 only: {e}");
                        vec![v4]
                    }
                    Err(source) => return Err(BindError::Bind { addr: v6, source }),
                }
            }
            Listen::Host(host, port) => {
                let mut addrs: Vec<SocketAddr> = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|source| BindError::Resolve {
                        host: host.clone(),
                        source,
                    })?
                    .collect();
                addrs.sort();
                addrs.dedup();
                let mut out = Vec::new();
                let mut unusable = None;
                for a in addrs {
                    match bind_std(a) {
                        Ok(l) => out.push(l),
                        // A name may resolve to an address family the node
                        // lacks (::1 with IPv6 disabled): serve the others.
                        Err(BindError::Bind { addr, source }) if no_such_address(&source) => {
                            unusable = Some(BindError::Bind { addr, source });
                        }
                        Err(e) => return Err(e),
                    }
                }
                if out.is_empty() {
                    return Err(unusable.unwrap_or_else(|| BindError::NoAddress(host.clone())));
                }
                out
            }
        };
        Ok(out)
    }
}

fn bind_std(addr: SocketAddr) -> Result<TcpListener, BindError> {
    let bind_err = |source| BindError::Bind { addr, source };
    let l = TcpListener::bind(addr).map_err(bind_err)?;
    l.set_nonblocking(true).map_err(bind_err)?;
    Ok(l)
}

/// An IPv6 socket that takes no IPv4 connection (`IPV6_V6ONLY`).
fn bind_v6_only(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let fd = rustix::net::socket_with(
        AddressFamily::INET6,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    sockopt::set_ipv6_v6only(&fd, true)?;
    // As std does for every listener: a restarted daemon rebinds at once.
    sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, BACKLOG)?;
    Ok(TcpListener::from(fd))
}

fn local_port(l: &TcpListener, asked: u16) -> u16 {
    l.local_addr().map_or(asked, |a| a.port())
}

/// The node has no such address or family (IPv6 disabled, an address of
/// another interface): not a reason to refuse the others.
fn no_such_address(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL | libc::EPROTONOSUPPORT)
    )
}

/// The addresses `listeners` serve, for the log line.
pub fn describe(listeners: &[TcpListener], https: bool) -> String {
    let scheme = if https { "https" } else { "http" };
    let urls: Vec<String> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .map(|a| match a.ip() {
            IpAddr::V6(ip) => format!("{scheme}://[{ip}]:{}", a.port()),
            IpAddr::V4(ip) => format!("{scheme}://{ip}:{}", a.port()),
        })
        .collect();
    urls.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_an_operator_writes() {
        let p = |s: &str| s.parse::<Listen>();
        assert_eq!(p(":9396"), Ok(Listen::AllInterfaces(9396)));
        assert_eq!(
            p("0.0.0.0:9396"),
            Ok(Listen::Addr(([0, 0, 0, 0], 9396).into()))
        );
        assert_eq!(
            p("[::1]:9396"),
            Ok(Listen::Addr((Ipv6Addr::LOCALHOST, 9396).into()))
        );
        assert_eq!(
            p("localhost:9396"),
            Ok(Listen::Host("localhost".into(), 9396))
        );
        assert_eq!(
            p("node-1.example.com:80"),
            Ok(Listen::Host("node-1.example.com".into(), 80))
        );
        assert_eq!(p("9396"), Err(ParseError::NoPort("9396".into())));
        assert!(matches!(p(":99999"), Err(ParseError::Port { .. })));
        assert!(matches!(p("localhost:"), Err(ParseError::Port { .. })));
        assert_eq!(p("::1:9396"), Err(ParseError::BareIpv6("::1".into())));
        assert_eq!(
            p("10.0.0.300:1"),
            Err(ParseError::Host("10.0.0.300".into()))
        );
        assert_eq!(p("a b:1"), Err(ParseError::Host("a b".into())));
        for s in [":9396", "127.0.0.1:1", "[::1]:2", "localhost:3"] {
            assert_eq!(p(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn a_bare_port_serves_ipv4_and_ipv6_on_one_port() {
        let ls = Listen::AllInterfaces(0).bind().unwrap();
        let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
        assert!(
            addrs[0].ip().is_unspecified() && addrs[0].is_ipv4(),
            "{addrs:?}"
        );
        if let Some(v6) = addrs.get(1) {
            assert!(v6.is_ipv6() && v6.port() == addrs[0].port(), "{addrs:?}");
        }
        let l = Listen::Host("localhost".into(), 0).bind().unwrap();
        assert!(!l.is_empty());
    }
}
