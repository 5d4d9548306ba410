//! Kubernetes' CEL `ip` and `cidr` libraries: `ip('10.0.0.1')` and
//! `cidr('10.0.0.0/8')` make addresses and networks to ask about (`family`,
//! `isLoopback`, `containsIP`, `prefixLength`, ...), and `isIP`/`isCIDR` say whether a
//! string is one; IPv4-mapped IPv6 addresses and zones are refused, as upstream's.

use std::net::IpAddr;

use cel::common::types::{CelBool, CelInt, CelString, Type};
use cel::{DeclarationError, Env, ExecutionError};

static IP: Type = Type::new_unspecified_type("net.IP");
static CIDR: Type = Type::new_unspecified_type("net.CIDR");

/// An address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ip(IpAddr);

/// A network: an address as written and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

opaque!(Ip, IP);
opaque!(Cidr, CIDR);

/// Registers the libraries on `env`.
pub fn extension(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(IP.to_owned())?;
    env.add_type(CIDR.to_owned())?;
    cel::add_overload!(env, fn ip: (CelString) -> Result<Ip>)?;
    cel::add_overload!(env, fn is_ip: (CelString) -> CelBool, name = "isIP")?;
    cel::add_overload!(env, fn is_canonical: (CelString) -> Result<CelBool>, name = "ip.isCanonical")?;
    cel::add_member_overload!(env, fn family: (Ip) -> CelInt)?;
    cel::add_member_overload!(env, fn is_unspecified: (Ip) -> CelBool)?;
    cel::add_member_overload!(env, fn is_loopback: (Ip) -> CelBool)?;
    cel::add_member_overload!(env, fn is_link_local_multicast: (Ip) -> CelBool)?;
    cel::add_member_overload!(env, fn is_link_local_unicast: (Ip) -> CelBool)?;
    cel::add_member_overload!(env, fn is_global_unicast: (Ip) -> CelBool)?;
    cel::add_overload!(env, fn cidr: (CelString) -> Result<Cidr>)?;
    cel::add_overload!(env, fn is_cidr: (CelString) -> CelBool, name = "isCIDR")?;
    cel::add_member_overload!(env, fn contains_ip: (Cidr, Ip) -> CelBool, name = "containsIP")?;
    cel::add_member_overload!(
        env,
        fn contains_ip_string: (Cidr, CelString) -> Result<CelBool>,
        name = "containsIP"
    )?;
    cel::add_member_overload!(
        env,
        fn contains_cidr: (Cidr, Cidr) -> CelBool,
        name = "containsCIDR"
    )?;
    cel::add_member_overload!(
        env,
        fn contains_cidr_string: (Cidr, CelString) -> Result<CelBool>,
        name = "containsCIDR"
    )?;
    cel::add_member_overload!(env, fn address: (Cidr) -> Ip, name = "ip")?;
    cel::add_member_overload!(env, fn masked: (Cidr) -> Cidr)?;
    cel::add_member_overload!(env, fn prefix_length: (Cidr) -> CelInt)?;
    Ok(())
}

/// An address as upstream's library takes one: no zone, no IPv4-mapped IPv6.
fn parse_ip(text: &str) -> Result<IpAddr, String> {
    if text.contains('%') {
        return Err(format!(
            "IP address {text:?} with zone value is not allowed"
        ));
    }
    let addr: IpAddr = text.parse().map_err(|e| {
        format!("IP Address {text:?} parse error during conversion from string: {e}")
    })?;
    if let IpAddr::V6(v6) = addr
        && v6.to_ipv4_mapped().is_some()
    {
        return Err(format!("IPv4-mapped IPv6 address {text:?} is not allowed"));
    }
    Ok(addr)
}

fn parse_cidr(text: &str) -> Result<Cidr, String> {
    let invalid = || {
        format!("network address {text:?} parse error during conversion from string: invalid CIDR")
    };
    let (addr, prefix) = text.split_once('/').ok_or_else(invalid)?;
    let addr = parse_ip(addr).map_err(|_| invalid())?;
    let prefix: u8 = prefix.parse().map_err(|_| invalid())?;
    if prefix > bits(addr) || prefix.to_string() != text.split_once('/').map_or("", |p| p.1) {
        return Err(invalid());
    }
    Ok(Cidr { addr, prefix })
}

fn bits(addr: IpAddr) -> u8 {
    if addr.is_ipv4() { 32 } else { 128 }
}

/// An address as a number, with its width.
fn number(addr: IpAddr) -> (u128, u8) {
    match addr {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

fn mask(prefix: u8, width: u8) -> u128 {
    let all = if width == 32 {
        u128::from(u32::MAX)
    } else {
        u128::MAX
    };
    if prefix == 0 {
        0
    } else {
        all & !((1u128 << (width - prefix)) - 1) & all
    }
}

impl Cidr {
    fn contains(&self, addr: IpAddr) -> bool {
        if addr.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        let (net, width) = number(self.addr);
        let (ip, _) = number(addr);
        let m = mask(self.prefix, width);
        net & m == ip & m
    }
}

fn failed(function: &str) -> impl Fn(String) -> ExecutionError + '_ {
    move |e| ExecutionError::function_error(function, e)
}

fn ip(text: &CelString<'_>) -> Result<Ip, ExecutionError> {
    parse_ip(text.inner()).map(Ip).map_err(failed("ip"))
}

fn is_ip(text: &CelString<'_>) -> CelBool {
    CelBool::from(parse_ip(text.inner()).is_ok())
}

fn is_canonical(text: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    let addr = parse_ip(text.inner()).map_err(failed("ip.isCanonical"))?;
    Ok(CelBool::from(addr.to_string() == text.inner()))
}

fn family(this: &Ip) -> CelInt {
    CelInt::from(if this.0.is_ipv4() { 4 } else { 6 })
}

fn is_unspecified(this: &Ip) -> CelBool {
    CelBool::from(this.0.is_unspecified())
}

fn is_loopback(this: &Ip) -> CelBool {
    CelBool::from(this.0.is_loopback())
}

fn is_link_local_multicast(this: &Ip) -> CelBool {
    CelBool::from(match this.0 {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => v6.octets()[0] == 0xff && v6.octets()[1] & 0x0f == 0x02,
    })
}

fn link_local_unicast(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

fn is_link_local_unicast(this: &Ip) -> CelBool {
    CelBool::from(link_local_unicast(this.0))
}

/// Go's `IsGlobalUnicast`: none of the special kinds above, nor broadcast.
fn is_global_unicast(this: &Ip) -> CelBool {
    let a = this.0;
    let broadcast = matches!(a, IpAddr::V4(v4) if v4.is_broadcast());
    CelBool::from(
        !broadcast
            && !a.is_unspecified()
            && !a.is_loopback()
            && !a.is_multicast()
            && !link_local_unicast(a),
    )
}

fn cidr(text: &CelString<'_>) -> Result<Cidr, ExecutionError> {
    parse_cidr(text.inner()).map_err(failed("cidr"))
}

fn is_cidr(text: &CelString<'_>) -> CelBool {
    CelBool::from(parse_cidr(text.inner()).is_ok())
}

fn contains_ip(this: &Cidr, addr: &Ip) -> CelBool {
    CelBool::from(this.contains(addr.0))
}

fn contains_ip_string(this: &Cidr, addr: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    let addr = parse_ip(addr.inner()).map_err(failed("containsIP"))?;
    Ok(CelBool::from(this.contains(addr)))
}

fn contains_cidr(this: &Cidr, other: &Cidr) -> CelBool {
    CelBool::from(other.prefix >= this.prefix && this.contains(other.addr))
}

fn contains_cidr_string(this: &Cidr, other: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    let other = parse_cidr(other.inner()).map_err(failed("containsCIDR"))?;
    Ok(contains_cidr(this, &other))
}

fn address(this: &Cidr) -> Ip {
    Ip(this.addr)
}

fn masked(this: &Cidr) -> Cidr {
    let (n, width) = number(this.addr);
    let masked = n & mask(this.prefix, width);
    let addr = if width == 32 {
        IpAddr::V4((masked as u32).into())
    } else {
        IpAddr::V6(masked.into())
    };
    Cidr {
        addr,
        prefix: this.prefix,
    }
}

fn prefix_length(this: &Cidr) -> CelInt {
    CelInt::from(i64::from(this.prefix))
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use cel::Value;

    #[test]
    fn addresses_and_networks_as_upstream() {
        for (expr, want) in [
            ("ip('10.0.0.1').family()", Value::Int(4)),
            ("ip('::1').isLoopback()", Value::Bool(true)),
            ("ip('169.254.1.1').isLinkLocalUnicast()", Value::Bool(true)),
            ("ip('ff02::1').isLinkLocalMulticast()", Value::Bool(true)),
            ("ip('8.8.8.8').isGlobalUnicast()", Value::Bool(true)),
            ("ip('0.0.0.0').isUnspecified()", Value::Bool(true)),
            ("isIP('1.2.3')", Value::Bool(false)),
            ("isIP('::ffff:1.2.3.4')", Value::Bool(false)),
            ("ip.isCanonical('2001:db8::1')", Value::Bool(true)),
            ("ip.isCanonical('2001:DB8::1')", Value::Bool(false)),
            ("ip('10.0.0.1') == ip('10.0.0.1')", Value::Bool(true)),
            (
                "cidr('10.0.0.0/8').containsIP('10.1.2.3')",
                Value::Bool(true),
            ),
            (
                "cidr('10.0.0.0/8').containsIP(ip('11.0.0.1'))",
                Value::Bool(false),
            ),
            (
                "cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')",
                Value::Bool(true),
            ),
            (
                "cidr('10.1.0.0/16').containsCIDR(cidr('10.0.0.0/8'))",
                Value::Bool(false),
            ),
            (
                "cidr('2001:db8::/32').containsIP('2001:db8::7')",
                Value::Bool(true),
            ),
            (
                "cidr('192.168.1.5/24').masked() == cidr('192.168.1.0/24')",
                Value::Bool(true),
            ),
            (
                "cidr('192.168.1.5/24').ip() == ip('192.168.1.5')",
                Value::Bool(true),
            ),
            ("cidr('192.168.1.0/24').prefixLength()", Value::Int(24)),
            ("isCIDR('10.0.0.0/33')", Value::Bool(false)),
            ("isCIDR('10.0.0.0')", Value::Bool(false)),
        ] {
            assert_eq!(eval(expr), Ok(want), "{expr}");
        }
        assert!(
            eval("ip('fe80::1%eth0')")
                .unwrap_err()
                .contains("zone value is not allowed")
        );
    }
}
