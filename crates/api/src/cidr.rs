//! IPv4 CIDR ranges (`10.42.0.0/16`): the service range the apiserver allocates from and
//! the cluster range that node IPAM cuts into per-node pod ranges ([`Ipv4Cidr`]), and
//! the address blocks that admit or refuse clients ([`Ipv4Block`]: NetworkPolicy's
//! `ipBlock`, `loadBalancerSourceRanges`, the Ingress's allowed source ranges).

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// A network address and prefix length; host bits are always zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    prefix: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CidrError {
    #[error("{0:?} is not an IPv4 CIDR (address/prefix)")]
    Syntax(String),
    #[error("prefix /{0} is out of range (at most /30)")]
    Prefix(u8),
}

impl Ipv4Cidr {
    pub fn new(ip: Ipv4Addr, prefix: u8) -> Result<Self, CidrError> {
        if prefix > 30 {
            return Err(CidrError::Prefix(prefix));
        }
        let mask = u32::MAX.checked_shl(32 - prefix as u32).unwrap_or(0);
        Ok(Ipv4Cidr {
            network: Ipv4Addr::from(u32::from(ip) & mask),
            prefix,
        })
    }

    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// How many addresses the range holds.
    pub fn size(&self) -> u64 {
        1u64 << (32 - self.prefix as u32)
    }

    /// How many ranges of `/prefix` fit in this one (0 if `prefix` is shorter).
    pub fn subnet_count(&self, prefix: u8) -> u64 {
        if prefix < self.prefix || prefix > 32 {
            0
        } else {
            1u64 << (prefix - self.prefix)
        }
    }

    /// The `index`th `/prefix` range inside this one.
    pub fn subnet(&self, prefix: u8, index: u64) -> Option<Ipv4Cidr> {
        if index >= self.subnet_count(prefix) {
            return None;
        }
        let step = 1u64 << (32 - prefix as u32);
        let ip = u32::from(self.network) as u64 + index * step;
        Ipv4Cidr::new(Ipv4Addr::from(ip as u32), prefix).ok()
    }

    /// Where `sub` (a `/prefix` range) sits inside this range, if it does.
    pub fn subnet_index(&self, sub: &Ipv4Cidr) -> Option<u64> {
        if sub.prefix < self.prefix || !self.contains(sub.network) {
            return None;
        }
        let offset = u32::from(sub.network) - u32::from(self.network);
        Some((offset >> (32 - sub.prefix as u32)) as u64)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        (u32::from(ip) as u64).wrapping_sub(u32::from(self.network) as u64) < self.size()
    }
}

impl FromStr for Ipv4Cidr {
    type Err = CidrError;
    fn from_str(s: &str) -> Result<Self, CidrError> {
        let syntax = || CidrError::Syntax(s.to_string());
        let (ip, bits) = s.split_once('/').ok_or_else(syntax)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| syntax())?;
        let bits: u8 = bits.parse().map_err(|_| syntax())?;
        Ipv4Cidr::new(ip, bits)
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// An address block as users write them to allow or refuse clients: any prefix up to
/// /32 (one address), host bits cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Block {
    network: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Block {
    fn mask(&self) -> u32 {
        u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.network)
    }
}

impl FromStr for Ipv4Block {
    type Err = CidrError;

    /// `address/prefix`, spaces around it ignored (lists are often written `a, b`).
    fn from_str(s: &str) -> Result<Self, CidrError> {
        let syntax = || CidrError::Syntax(s.to_string());
        let (ip, bits) = s.trim().split_once('/').ok_or_else(syntax)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| syntax())?;
        let prefix: u8 = bits.parse().map_err(|_| syntax())?;
        if prefix > 32 {
            return Err(syntax());
        }
        let mut block = Ipv4Block {
            network: ip,
            prefix,
        };
        block.network = Ipv4Addr::from(u32::from(ip) & block.mask());
        Ok(block)
    }
}

impl fmt::Display for Ipv4Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_masks_host_bits() {
        let c: Ipv4Cidr = "10.42.7.9/16".parse().unwrap();
        assert_eq!(c.to_string(), "10.42.0.0/16");
        assert_eq!(c.size(), 65536);
        assert!(c.contains("10.42.255.1".parse().unwrap()));
        assert!(!c.contains("10.43.0.0".parse().unwrap()));
        assert_eq!(
            "10.0.0.0".parse::<Ipv4Cidr>(),
            Err(CidrError::Syntax("10.0.0.0".into()))
        );
        assert_eq!(
            "10.0.0.0/31".parse::<Ipv4Cidr>(),
            Err(CidrError::Prefix(31))
        );
    }

    #[test]
    fn cuts_into_subnets_and_finds_them_again() {
        let c: Ipv4Cidr = "10.42.0.0/16".parse().unwrap();
        assert_eq!(c.subnet_count(24), 256);
        assert_eq!(c.subnet(24, 0).unwrap().to_string(), "10.42.0.0/24");
        assert_eq!(c.subnet(24, 255).unwrap().to_string(), "10.42.255.0/24");
        assert_eq!(c.subnet(24, 256), None);
        let sub: Ipv4Cidr = "10.42.17.0/24".parse().unwrap();
        assert_eq!(c.subnet_index(&sub), Some(17));
        assert_eq!(c.subnet_index(&"10.43.0.0/24".parse().unwrap()), None);
    }

    #[test]
    fn blocks_take_any_prefix_and_clear_host_bits() {
        let one: Ipv4Block = " 10.1.2.3/32".parse().unwrap();
        assert!(one.contains("10.1.2.3".parse().unwrap()));
        assert!(!one.contains("10.1.2.4".parse().unwrap()));
        let wide: Ipv4Block = "10.1.2.3/8".parse().unwrap();
        assert_eq!(wide.to_string(), "10.0.0.0/8");
        assert!(wide.contains("10.255.0.1".parse().unwrap()));
        let all: Ipv4Block = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Ipv4Block>().is_err());
        assert!("fd00::/8".parse::<Ipv4Block>().is_err());
    }
}
