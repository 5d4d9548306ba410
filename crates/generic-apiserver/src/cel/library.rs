//! Kubernetes' own CEL libraries, beside CEL's standard library and its strings and
//! lists extensions: the `lists` library (`isSorted`, `sum`, `min`, `max`, `indexOf`,
//! `lastIndexOf`) and the `regex` library (`find`, `findAll`), with upstream's names
//! and errors.

use std::cmp::Ordering;

use cel::common::types::{CelInt, CelList, CelString, DYN_TYPE, LIST_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// Registers the libraries on `env` (see [`Env::add_extension`]).
pub fn extension(env: &mut Env) -> Result<(), DeclarationError> {
    // By hand, as the lists extension does: these take any list, not only a `CelList`.
    env.add_member_overload("isSorted", "list.isSorted()", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list.sum()", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list.min()", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list.max()", LIST_TYPE, vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list.indexOf(dyn)",
        LIST_TYPE,
        vec![DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list.lastIndexOf(dyn)",
        LIST_TYPE,
        vec![DYN_TYPE],
        last_index_of,
    )?;
    cel::add_member_overload!(env, fn find: (CelString, CelString) -> Result<CelString>)?;
    cel::add_member_overload!(env, fn find_all: (CelString, CelString) -> Result<CelList>)?;
    cel::add_member_overload!(
        env,
        fn find_all_n: (CelString, CelString, CelInt) -> Result<CelList>,
        name = "findAll"
    )?;
    Ok(())
}

/// The receiver and the arguments of an overload.
fn args<'b, 'v, const N: usize>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<[CowVal<'b, 'v>; N], ExecutionError> {
    args.try_into()
        .map_err(|args: Vec<_>| ExecutionError::invalid_argument_count(N, args.len()))
}

/// The elements of a list, borrowed.
fn elements<'b, 'v>(list: &'b (dyn Val + 'v)) -> Result<Vec<&'b (dyn Val + 'v)>, ExecutionError> {
    let iterable = list
        .as_iterable()
        .ok_or_else(|| ExecutionError::UnexpectedType {
            got: list.get_type().name().to_owned(),
            want: "list".to_owned(),
        })?;
    let mut items = iterable.iter();
    let mut out = Vec::new();
    while let Some(item) = items.next() {
        out.push(item);
    }
    Ok(out)
}

fn compare(a: &dyn Val, b: &dyn Val, function: &str) -> Result<Ordering, ExecutionError> {
    a.as_comparer()
        .ok_or_else(|| {
            ExecutionError::function_error(function, "list elements must be comparable")
        })?
        .compare(b)
}

fn is_sorted<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = args(call)?;
    let items = elements(list.as_ref())?;
    for pair in items.windows(2) {
        if compare(pair[0], pair[1], "isSorted")? == Ordering::Greater {
            return Ok(CowVal::owned(cel::common::types::CelBool::from(false)));
        }
    }
    Ok(CowVal::owned(cel::common::types::CelBool::from(true)))
}

fn sum<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = args(call)?;
    let items = elements(list.as_ref())?;
    let Some((first, rest)) = items.split_first() else {
        return Ok(CowVal::owned(CelInt::from(0)));
    };
    let mut total: Box<dyn Val + 'v> = first.clone_as_boxed();
    for item in rest {
        let adder = total.as_adder().ok_or_else(|| {
            ExecutionError::function_error("sum", "list elements must be numbers")
        })?;
        let next = adder.add(*item)?.as_ref().clone_as_boxed();
        total = next;
    }
    Ok(CowVal::Owned(total))
}

/// The least (`Ordering::Less`) or greatest element; upstream's error for none.
fn extreme<'b, 'v>(
    call: Vec<CowVal<'b, 'v>>,
    name: &str,
    wanted: Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = args(call)?;
    let items = elements(list.as_ref())?;
    let mut best = *items.first().ok_or_else(|| {
        ExecutionError::function_error(name, format!("{name} called on empty list"))
    })?;
    for item in &items[1..] {
        if compare(*item, best, name)? == wanted {
            best = *item;
        }
    }
    Ok(CowVal::Owned(best.clone_as_boxed()))
}

fn min<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(call, "min", Ordering::Less)
}

fn max<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(call, "max", Ordering::Greater)
}

/// The index of the first (or last) element equal to the argument, or -1.
fn position<'b, 'v>(
    call: Vec<CowVal<'b, 'v>>,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list, wanted] = args(call)?;
    let items = elements(list.as_ref())?;
    let mut found = items
        .iter()
        .enumerate()
        .filter(|(_, item)| item.equals(wanted.as_ref()))
        .map(|(i, _)| i as i64);
    let index = if last {
        found.next_back()
    } else {
        found.next()
    };
    Ok(CowVal::owned(CelInt::from(index.unwrap_or(-1))))
}

fn index_of<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(call, false)
}

fn last_index_of<'b, 'v>(call: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(call, true)
}

fn regex(function: &str, pattern: &str) -> Result<regex::Regex, ExecutionError> {
    regex::Regex::new(pattern).map_err(|e| ExecutionError::function_error(function, e))
}

/// The first match of the regex, or `""`.
fn find(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
) -> Result<CelString<'static>, ExecutionError> {
    let re = regex("find", pattern.inner())?;
    let found = re.find(this.inner()).map_or("", |m| m.as_str());
    Ok(CelString::from(found.to_owned()))
}

fn find_all(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
) -> Result<CelList<'static>, ExecutionError> {
    matches(this, pattern, -1)
}

fn find_all_n(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
    limit: &CelInt,
) -> Result<CelList<'static>, ExecutionError> {
    matches(this, pattern, *limit.inner())
}

/// Every match (at most `limit`, when it is not negative).
fn matches(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
    limit: i64,
) -> Result<CelList<'static>, ExecutionError> {
    let re = regex("findAll", pattern.inner())?;
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let found: Vec<Box<dyn Val>> = re
        .find_iter(this.inner())
        .take(limit)
        .map(|m| Box::new(CelString::from(m.as_str().to_owned())) as Box<dyn Val>)
        .collect();
    Ok(CelList::from(found))
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use cel::Value;

    #[test]
    fn kubernetes_list_functions() {
        for (expr, want) in [
            ("[1, 2, 2, 5].isSorted()", Value::Bool(true)),
            ("['b', 'a'].isSorted()", Value::Bool(false)),
            ("[1, 2, 3].sum()", Value::Int(6)),
            ("[1.5, 2.0].sum()", Value::Float(3.5)),
            ("[].sum()", Value::Int(0)),
            ("[3, 1, 2].min()", Value::Int(1)),
            (
                "['a', 'c', 'b'].max()",
                Value::String("c".to_string().into()),
            ),
            ("[1, 2, 1].indexOf(1)", Value::Int(0)),
            ("[1, 2, 1].lastIndexOf(1)", Value::Int(2)),
            ("[1, 2].indexOf(3)", Value::Int(-1)),
            ("'abc'.indexOf('c')", Value::Int(2)),
        ] {
            assert_eq!(eval(expr), Ok(want), "{expr}");
        }
        assert!(
            eval("[].min()")
                .unwrap_err()
                .contains("min called on empty list")
        );
    }

    #[test]
    fn kubernetes_regex_functions() {
        assert_eq!(
            eval("'abc 123 def 456'.find('[0-9]+')"),
            Ok(Value::String("123".to_string().into()))
        );
        assert_eq!(
            eval("'abc'.find('[0-9]+')"),
            Ok(Value::String("".to_string().into()))
        );
        assert_eq!(
            eval("'abc 123 def 456'.findAll('[0-9]+') == ['123', '456']"),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            eval("'abc 123 def 456'.findAll('[0-9]+', 1) == ['123']"),
            Ok(Value::Bool(true))
        );
        assert!(eval("'x'.find('[')").is_err());
    }
}
