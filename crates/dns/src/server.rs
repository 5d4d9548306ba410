//! The DNS protocol side: hickory-server's UDP and TCP serving, answers from the current
//! [`Zone`] snapshot (authoritative, with the zone's SOA on empty and negative answers so
//! resolvers cache them for the TTL), and everything else forwarded to the upstream
//! nameservers.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use hickory_proto::op::{
    Edns, Header, HeaderCounts, Message, Metadata, OpCode, Query, ResponseCode,
};
use hickory_proto::rr::rdata::{A, CNAME, PTR, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_server::net::runtime::Time;
use hickory_server::net::xfer::Protocol;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponse, MessageResponseBuilder};
use krust_api::sync::UnpoisonedRw;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::timeout;

use crate::metrics::{Metrics, Question};
use crate::zone::{self, Answer, QueryType, Zone};

/// The TTL of every answer (CoreDNS's kubernetes plugin default).
pub const TTL: u32 = 5;
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// The zone snapshot the handler answers from; replaced whole when the cluster changes.
pub type SharedZone = Arc<RwLock<Arc<Zone>>>;

pub struct Handler {
    zone: SharedZone,
    soa: Record,
    upstreams: Vec<SocketAddr>,
    metrics: Metrics,
}

impl Handler {
    pub fn new(
        domain: &str,
        zone: SharedZone,
        upstreams: Vec<SocketAddr>,
        metrics: Metrics,
    ) -> Handler {
        let apex = name(&format!("{}.", domain.trim_end_matches('.')));
        let soa = Record::from_rdata(
            apex.clone(),
            TTL,
            RData::SOA(SOA::new(
                name(&format!("ns.dns.{apex}")),
                name(&format!("hostmaster.{apex}")),
                1,
                7200,
                1800,
                86400,
                TTL,
            )),
        );
        Handler {
            zone,
            soa,
            upstreams,
            metrics,
        }
    }

    /// The upstream's answer records for `target`, none if it cannot say.
    async fn resolve(&self, target: &str, query_type: RecordType) -> Vec<Record> {
        let mut query = Message::query();
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(name(target), query_type));
        let Ok(raw) = query.to_vec() else {
            return Vec::new();
        };
        self.forward(&raw)
            .await
            .map(|reply| reply.answers)
            .unwrap_or_default()
    }

    /// The first upstream answer to the client's own query bytes.
    async fn forward(&self, raw: &[u8]) -> Option<Message> {
        for upstream in &self.upstreams {
            match timeout(UPSTREAM_TIMEOUT, exchange(*upstream, raw)).await {
                Ok(Ok(bytes)) => match Message::from_vec(&bytes) {
                    Ok(message) => return Some(message),
                    Err(err) => tracing::debug!(%upstream, error = %err, "bad upstream reply"),
                },
                Ok(Err(err)) => tracing::debug!(%upstream, error = %err, "upstream failed"),
                Err(_) => tracing::debug!(%upstream, "upstream timed out"),
            }
        }
        None
    }
}

/// A name the code builds from known-good parts.
fn name(s: &str) -> Name {
    Name::from_str(s).unwrap_or_else(|_| Name::root())
}

fn query_type(t: RecordType) -> QueryType {
    match t {
        RecordType::A => QueryType::A,
        RecordType::SRV => QueryType::Srv,
        RecordType::PTR => QueryType::Ptr,
        RecordType::CNAME => QueryType::Cname,
        _ => QueryType::Other,
    }
}

/// A zone record as a DNS record, owned by `owner` (the question's name as the client
/// spelled it: all the zone's answers are about the asked name).
fn record(owner: &Name, r: &zone::Record) -> Record {
    let data = match r {
        zone::Record::A(_, ip) => RData::A(A(*ip)),
        zone::Record::Cname(_, target) => RData::CNAME(CNAME(name(target))),
        zone::Record::Ptr(_, target) => RData::PTR(PTR(name(target))),
        zone::Record::Srv { port, target, .. } => RData::SRV(SRV::new(0, 100, *port, name(target))),
    };
    Record::from_rdata(owner.clone(), TTL, data)
}

/// UDP to `upstream`; again over TCP when the answer was truncated.
async fn exchange(upstream: SocketAddr, raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let bind: SocketAddr = if upstream.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(bind).await?;
    socket.connect(upstream).await?;
    socket.send(raw).await?;
    let mut buf = vec![0u8; 65535];
    let reply = loop {
        let n = socket.recv(&mut buf).await?;
        // A connected socket only hears from the upstream; match the message ID too.
        if n >= 12 && buf[..2] == raw[..2] {
            buf.truncate(n);
            break buf;
        }
    };
    const TRUNCATED: u8 = 0x02;
    if reply[2] & TRUNCATED == 0 {
        return Ok(reply);
    }
    let mut stream = TcpStream::connect(upstream).await?;
    let len = u16::try_from(raw.len()).map_err(std::io::Error::other)?;
    stream.write_all(&len.to_be_bytes()).await?;
    stream.write_all(raw).await?;
    let len = stream.read_u16().await? as usize;
    let mut reply = vec![0u8; len];
    stream.read_exact(&mut reply).await?;
    Ok(reply)
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        response: R,
    ) -> ResponseInfo {
        let started = Instant::now();
        let info = self.answer(request, response).await;
        let query_type = match request.request_info() {
            Ok(info) => info.query.query_type().to_string(),
            Err(_) => "other".into(),
        };
        let question = Question {
            proto: match request.protocol() {
                Protocol::Tcp => "tcp",
                _ => "udp",
            },
            query_type: &query_type,
        };
        let rcode = u16::from(info.response_code);
        self.metrics
            .answered(&question, rcode, started.elapsed().as_secs_f64());
        info
    }
}

impl Handler {
    async fn answer<R: ResponseHandler>(&self, request: &Request, mut response: R) -> ResponseInfo {
        let fail = |code| {
            MessageResponseBuilder::from_message_request(request).error_msg(&request.metadata, code)
        };
        if request.metadata.op_code != OpCode::Query {
            return send(&mut response, fail(ResponseCode::NotImp), request).await;
        }
        let Ok(info) = request.request_info() else {
            return send(&mut response, fail(ResponseCode::FormErr), request).await;
        };
        // EDNS in the answer only when the question had it.
        let edns = request.edns.as_ref().map(|asked| {
            let mut e = Edns::new();
            e.set_max_payload(asked.max_payload().max(512));
            e
        });
        let owner = info.query.original().name().clone();
        let zone = self.zone.read_locked().clone();
        let answer = zone.lookup(&owner.to_ascii(), query_type(info.query.query_type()));
        let mut meta = Metadata::response_from_request(&request.metadata);
        meta.recursion_available = true;
        let builder = MessageResponseBuilder::new(&request.queries, edns.as_ref());
        let (records, soa) = match answer {
            Answer::Records(rs) => {
                let mut records: Vec<Record> = rs.iter().map(|r| record(&owner, r)).collect();
                // An ExternalName's target is resolved into the answer, as CoreDNS does:
                // stub resolvers do not chase a lone CNAME.
                if let [zone::Record::Cname(_, target)] = rs.as_slice()
                    && info.query.query_type() != RecordType::CNAME
                {
                    records.extend(self.resolve(target, info.query.query_type()).await);
                }
                (records, None)
            }
            Answer::NoData => (Vec::new(), Some(&self.soa)),
            Answer::NxDomain => {
                meta.response_code = ResponseCode::NXDomain;
                (Vec::new(), Some(&self.soa))
            }
            Answer::Forward => {
                let Some(upstream) = self.forward(request.as_slice()).await else {
                    return send(&mut response, fail(ResponseCode::ServFail), request).await;
                };
                // Relayed as the upstream said it, under the client's message ID; the
                // upstream's EDNS options stay, sized for this client.
                let mut meta = upstream.metadata;
                meta.id = request.metadata.id;
                let edns = match (&upstream.edns, &edns) {
                    (Some(theirs), Some(ours)) => {
                        let mut e = theirs.clone();
                        e.set_max_payload(ours.max_payload());
                        Some(e)
                    }
                    (_, ours) => ours.clone(),
                };
                let relayed = MessageResponseBuilder::new(&request.queries, edns.as_ref()).build(
                    meta,
                    upstream.answers.iter(),
                    upstream.authorities.iter(),
                    [],
                    upstream.additionals.iter(),
                );
                return send(&mut response, relayed, request).await;
            }
        };
        meta.authoritative = true;
        let answered = builder.build(meta, records.iter(), [], soa, []);
        send(&mut response, answered, request).await
    }
}

/// Sends `message`; a failure to send is logged and reported as SERVFAIL.
async fn send<'a, R: ResponseHandler>(
    handle: &mut R,
    message: MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
        impl Iterator<Item = &'a Record> + Send + 'a,
    >,
    request: &Request,
) -> ResponseInfo {
    match handle.send_response(message).await {
        Ok(info) => info,
        Err(err) => {
            tracing::debug!(error = %err, client = %request.src(), "sending a DNS answer failed");
            let mut metadata = Metadata::response_from_request(&request.metadata);
            metadata.response_code = ResponseCode::ServFail;
            Header {
                metadata,
                counts: HeaderCounts::default(),
            }
            .into()
        }
    }
}

/// The nameservers of a resolv.conf, on port 53.
pub fn upstreams_of(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_come_from_resolv_conf() {
        let conf = "# generated\nsearch example.org\nnameserver 10.0.0.2\nnameserver  fd00::53\noptions ndots:1\n";
        assert_eq!(
            upstreams_of(conf),
            vec![
                "10.0.0.2:53".parse::<SocketAddr>().unwrap(),
                "[fd00::53]:53".parse().unwrap()
            ]
        );
    }
}
