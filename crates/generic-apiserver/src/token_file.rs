//! Static tokens from a file (upstream's `--token-auth-file`): one `token,user,uid` line
//! per token in CSV, optionally with a fourth column of comma-separated groups
//! (`"group1,group2"`). Read once at start, as upstream.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::auth::{Authenticator, Credentials, User};

pub struct TokenFile {
    tokens: HashMap<String, User>,
}

impl TokenFile {
    pub fn load(path: &Path) -> Result<TokenFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the token file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("token file {}", path.display()))
    }

    fn parse(text: &str) -> Result<TokenFile> {
        let mut tokens = HashMap::new();
        for (number, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let record = csv_record(line)
                .with_context(|| format!("line {}: unterminated quote", number + 1))?;
            if record.len() < 3 {
                bail!(
                    "must have at least 3 columns (token, user name, user uid), found {} on line {}",
                    record.len(),
                    number + 1
                );
            }
            if record[0].is_empty() {
                tracing::warn!(line = number + 1, "empty token in the token file");
                continue;
            }
            let mut groups: Vec<String> = record
                .get(3)
                .filter(|g| !g.is_empty())
                .map(|g| g.split(',').map(str::to_string).collect())
                .unwrap_or_default();
            groups.push("system:authenticated".into());
            let user = User {
                name: record[1].clone(),
                groups,
            };
            if tokens.insert(record[0].clone(), user).is_some() {
                tracing::warn!(line = number + 1, "duplicate token in the token file");
            }
        }
        Ok(TokenFile { tokens })
    }
}

impl Authenticator for TokenFile {
    fn authenticate(&self, creds: &Credentials<'_>) -> Option<User> {
        self.tokens.get(creds.bearer?).cloned()
    }
}

/// The fields of one CSV line (RFC 4180 quoting, leading spaces trimmed as Go's
/// `TrimLeadingSpace`); `None` for a quote left open.
fn csv_record(line: &str) -> Option<Vec<String>> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
        let mut field = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next()? {
                    '"' if chars.next_if_eq(&'"').is_some() => field.push('"'),
                    '"' => break,
                    c => field.push(c),
                }
            }
            // Whatever follows the closing quote up to the comma belongs to the field.
            while let Some(c) = chars.next_if(|c| *c != ',') {
                field.push(c);
            }
        } else {
            while let Some(c) = chars.next_if(|c| *c != ',') {
                field.push(c);
            }
        }
        fields.push(field);
        if chars.next().is_none() {
            return Some(fields);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_give_users_with_their_groups() {
        let file = TokenFile::parse(
            "admin-token,admin,admin,\"system:masters\"\n\nplain,bob,1\ngroups,carol,2,\"a,b\"\n",
        )
        .unwrap();
        let user = |token: &str| {
            file.authenticate(&Credentials {
                client_cert: None,
                bearer: Some(token),
                audiences: &[],
            })
        };
        let admin = user("admin-token").unwrap();
        assert_eq!(admin.name, "admin");
        assert_eq!(admin.groups, ["system:masters", "system:authenticated"]);
        assert_eq!(user("plain").unwrap().groups, ["system:authenticated"]);
        assert_eq!(
            user("groups").unwrap().groups,
            ["a", "b", "system:authenticated"]
        );
        assert_eq!(user("nope"), None);
    }

    #[test]
    fn short_lines_and_open_quotes_are_refused() {
        let short = TokenFile::parse("token,user\n").err().unwrap();
        assert!(
            short.to_string().contains("must have at least 3 columns"),
            "{short}"
        );
        assert!(TokenFile::parse("t,u,1,\"open\n").is_err());
    }
}
