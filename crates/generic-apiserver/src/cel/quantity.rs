//! Kubernetes' CEL `quantity` library: `quantity('1.5Gi')` makes a resource quantity
//! that compares, adds and converts as upstream's `resource.Quantity` does
//! (`isLessThan`, `isGreaterThan`, `compareTo`, `add`, `sub`, `sign`, `isInteger`,
//! `asInteger`, `asApproximateFloat`), and `isQuantity` says whether a string is one.
//! Values are kept in thousandths, so parts below a milli-unit round up.

use std::cmp::Ordering;

use cel::common::types::{CelBool, CelDouble, CelInt, CelString, Type};
use cel::{DeclarationError, Env, ExecutionError};
use krust_api::quantity::scaled_value;

static QUANTITY: Type = Type::new_unspecified_type("kubernetes.Quantity");

/// A quantity, in thousandths of its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity(i128);

opaque!(Quantity, QUANTITY);

/// Registers the library on `env`.
pub fn extension(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(QUANTITY.to_owned())?;
    cel::add_overload!(env, fn quantity: (CelString) -> Result<Quantity>)?;
    cel::add_overload!(env, fn is_quantity: (CelString) -> CelBool)?;
    cel::add_member_overload!(env, fn is_less_than: (Quantity, Quantity) -> CelBool)?;
    cel::add_member_overload!(env, fn is_greater_than: (Quantity, Quantity) -> CelBool)?;
    cel::add_member_overload!(env, fn compare_to: (Quantity, Quantity) -> CelInt)?;
    cel::add_member_overload!(env, fn add: (Quantity, Quantity) -> Quantity)?;
    cel::add_member_overload!(env, fn add_int: (Quantity, CelInt) -> Quantity, name = "add")?;
    cel::add_member_overload!(env, fn sub: (Quantity, Quantity) -> Quantity)?;
    cel::add_member_overload!(env, fn sub_int: (Quantity, CelInt) -> Quantity, name = "sub")?;
    cel::add_member_overload!(env, fn sign: (Quantity) -> CelInt)?;
    cel::add_member_overload!(env, fn is_integer: (Quantity) -> CelBool)?;
    cel::add_member_overload!(env, fn as_integer: (Quantity) -> Result<CelInt>)?;
    cel::add_member_overload!(env, fn as_approximate_float: (Quantity) -> CelDouble)?;
    Ok(())
}

fn parse(text: &str) -> Option<Quantity> {
    // Upstream's grammar: a signed decimal, then a suffix; no spaces.
    if text.is_empty() || text.trim() != text {
        return None;
    }
    scaled_value(text, 3)
        .ok()
        .map(|milli| Quantity(i128::from(milli)))
}

fn quantity(text: &CelString<'_>) -> Result<Quantity, ExecutionError> {
    parse(text.inner()).ok_or_else(|| {
        ExecutionError::function_error(
            "quantity",
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        )
    })
}

fn is_quantity(text: &CelString<'_>) -> CelBool {
    CelBool::from(parse(text.inner()).is_some())
}

fn is_less_than(this: &Quantity, other: &Quantity) -> CelBool {
    CelBool::from(this < other)
}

fn is_greater_than(this: &Quantity, other: &Quantity) -> CelBool {
    CelBool::from(this > other)
}

fn compare_to(this: &Quantity, other: &Quantity) -> CelInt {
    CelInt::from(match this.cmp(other) {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    })
}

fn add(this: &Quantity, other: &Quantity) -> Quantity {
    Quantity(this.0 + other.0)
}

fn add_int(this: &Quantity, n: &CelInt) -> Quantity {
    Quantity(this.0 + i128::from(*n.inner()) * 1000)
}

fn sub(this: &Quantity, other: &Quantity) -> Quantity {
    Quantity(this.0 - other.0)
}

fn sub_int(this: &Quantity, n: &CelInt) -> Quantity {
    Quantity(this.0 - i128::from(*n.inner()) * 1000)
}

fn sign(this: &Quantity) -> CelInt {
    CelInt::from(this.0.signum() as i64)
}

fn is_integer(this: &Quantity) -> CelBool {
    CelBool::from(this.0 % 1000 == 0 && i64::try_from(this.0 / 1000).is_ok())
}

fn as_integer(this: &Quantity) -> Result<CelInt, ExecutionError> {
    match i64::try_from(this.0 / 1000) {
        Ok(n) if this.0 % 1000 == 0 => Ok(CelInt::from(n)),
        _ => Err(ExecutionError::function_error(
            "asInteger",
            "cannot convert value to integer",
        )),
    }
}

fn as_approximate_float(this: &Quantity) -> CelDouble {
    CelDouble::from(this.0 as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use cel::Value;

    #[test]
    fn quantities_compare_add_and_convert_as_upstream() {
        for (expr, want) in [
            (
                "quantity('1Gi').isGreaterThan(quantity('1G'))",
                Value::Bool(true),
            ),
            (
                "quantity('500m').isLessThan(quantity('1'))",
                Value::Bool(true),
            ),
            ("quantity('1000m') == quantity('1')", Value::Bool(true)),
            ("quantity('1').compareTo(quantity('2'))", Value::Int(-1)),
            (
                "quantity('1.5').add(quantity('500m')).asInteger()",
                Value::Int(2),
            ),
            ("quantity('3').sub(1).asInteger()", Value::Int(2)),
            ("quantity('-2').sign()", Value::Int(-1)),
            ("quantity('1.5').isInteger()", Value::Bool(false)),
            ("quantity('250m').asApproximateFloat()", Value::Float(0.25)),
            ("isQuantity('12Mi')", Value::Bool(true)),
            ("isQuantity('12 Mi')", Value::Bool(false)),
        ] {
            assert_eq!(eval(expr), Ok(want), "{expr}");
        }
        assert!(
            eval("quantity('x')")
                .unwrap_err()
                .contains("quantities must match")
        );
        assert!(eval("quantity('1.5').asInteger()").is_err());
    }
}
