//! A YAML document as a tree of nodes that remember where they were written.
//!
//! serde_yaml_ng reports a position only for the first error it meets and exposes no event
//! API, so the loader parses with saphyr-parser (pure Rust, YAML 1.2) and keeps the
//! start position of every node. Scalars are kept as text with their style; the decoder
//! gives them a type according to the schema (YAML 1.2 core schema rules for plain scalars).

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

/// A 1-based line and column (columns count characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location {
    /// Line, starting at 1.
    pub line: usize,
    /// Column, starting at 1, in characters.
    pub column: usize,
}

impl Location {
    fn of(span: &Span) -> Location {
        Location {
            line: span.start.line(),
            column: span.start.col() + 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub at: Location,
    pub kind: Kind,
}

/// Scalars may be DH-HMAC-CHAP secrets written inline: zero them when the tree goes.
impl Drop for Node {
    fn drop(&mut self) {
        if let Kind::Scalar { text, .. } = &mut self.kind {
            zeroize::Zeroize::zeroize(text);
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    /// Entries in document order; keys are scalars (checked while parsing) and unique.
    Map(Vec<(Node, Node)>),
}

/// A syntax error, or a YAML feature the configuration does not accept.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyntaxError {
    pub at: Location,
    pub message: String,
}

impl Node {
    /// For a scalar: its text. Keys are always scalars.
    pub fn text(&self) -> &str {
        match &self.kind {
            Kind::Scalar { text, .. } => text,
            _ => "",
        }
    }

    /// A plain `~`, `null` (any YAML 1.2 spelling) or empty scalar.
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, plain: true }
            if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What the node is, for "expected X, found Y" messages.
    pub fn describe(&self) -> String {
        match &self.kind {
            _ if self.is_null() => "nothing (null)".into(),
            Kind::Scalar { text, plain } => {
                let quoted = if *plain { "" } else { "quoted " };
                let shown: String = text.chars().take(40).collect();
                let ell = if text.chars().count() > 40 { "…" } else { "" };
                format!("the {quoted}value `{shown}{ell}`")
            }
            Kind::Seq(_) => "a list".into(),
            Kind::Map(_) => "a mapping".into(),
        }
    }
}

/// Parses one YAML document. An empty document is an empty mapping.
pub(crate) fn parse(text: &str) -> Result<Node, SyntaxError> {
    let mut parser = Parser::new_from_str(text);
    // At the end of a text without a final line break the parser reports positions on the
    // line after the last one; those point at the end of the text instead.
    let end = end_of(text);
    let mut builder = Builder {
        stack: Vec::new(),
        root: None,
        documents: 0,
        end,
    };
    loop {
        let (event, span) = match parser.next_event() {
            None => break,
            Some(Ok(ev)) => ev,
            Some(Err(e)) => {
                let m = e.marker();
                let at = Location {
                    line: m.line(),
                    column: m.col() + 1,
                };
                return Err(SyntaxError {
                    at: at.min(end),
                    message: format!("YAML syntax error: {}", e.info()),
                });
            }
        };
        if builder.event(event, &span)? {
            break;
        }
    }
    match builder.root {
        Some(root) if !root.is_null() => Ok(root),
        _ => Ok(Node {
            at: Location { line: 1, column: 1 },
            kind: Kind::Map(Vec::new()),
        }),
    }
}

/// The schema nests five levels deep; anything far deeper is a mistake or an attack (and
/// dropping a very deep tree would recurse).
const MAX_DEPTH: usize = 32;

enum Open {
    Seq(Location, Vec<Node>),
    /// Entries so far, a key waiting for its value, and the line of each key seen.
    Map(
        Location,
        Vec<(Node, Node)>,
        Option<Node>,
        HashMap<String, usize>,
    ),
}

struct Builder {
    stack: Vec<Open>,
    root: Option<Node>,
    documents: usize,
    /// The end of the text: no location points past it.
    end: Location,
}

impl Builder {
    /// Handles one event; `Ok(true)` at the end of the stream.
    fn event(&mut self, event: Event<'_>, span: &Span) -> Result<bool, SyntaxError> {
        let at = Location::of(span).min(self.end);
        let unsupported = |what: &str| {
            Err(SyntaxError {
                at,
                message: format!("{what} are not supported in this file"),
            })
        };
        match event {
            Event::StreamEnd => return Ok(true),
            Event::StreamStart | Event::Nothing | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(SyntaxError {
                        at,
                        message: "only one YAML document is allowed (found a second `---`)".into(),
                    });
                }
            }
            Event::Alias(_) => return unsupported("YAML aliases (`*name`)"),
            Event::Scalar(_, _, _, Some(_))
            | Event::SequenceStart(_, Some(_))
            | Event::MappingStart(_, Some(_)) => return unsupported("YAML tags (`!tag`)"),
            Event::Scalar(text, style, _, None) => {
                let plain = style == ScalarStyle::Plain;
                self.push(Node {
                    at,
                    kind: Kind::Scalar {
                        text: text.into_owned(),
                        plain,
                    },
                })?;
            }
            Event::SequenceStart(_, None) | Event::MappingStart(_, None)
                if self.stack.len() >= MAX_DEPTH =>
            {
                return Err(SyntaxError {
                    at,
                    message: format!("lists and mappings nest deeper than {MAX_DEPTH} levels"),
                });
            }
            Event::SequenceStart(_, None) => self.stack.push(Open::Seq(at, Vec::new())),
            Event::MappingStart(_, None) => {
                self.stack
                    .push(Open::Map(at, Vec::new(), None, HashMap::new()))
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match self.stack.pop() {
                    Some(Open::Seq(at, items)) => Node {
                        at,
                        kind: Kind::Seq(items),
                    },
                    Some(Open::Map(at, entries, _, _)) => Node {
                        at,
                        kind: Kind::Map(entries),
                    },
                    None => {
                        return Err(SyntaxError {
                            at,
                            message: "unbalanced YAML".into(),
                        })
                    }
                };
                self.push(node)?;
            }
        }
        Ok(false)
    }

    fn push(&mut self, node: Node) -> Result<(), SyntaxError> {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Open::Seq(_, items)) => items.push(node),
            Some(Open::Map(_, entries, pending, seen)) => match pending.take() {
                Some(key) => entries.push((key, node)),
                None => {
                    if !matches!(node.kind, Kind::Scalar { .. }) {
                        return Err(SyntaxError {
                            at: node.at,
                            message: "mapping keys must be plain names, not lists or mappings"
                                .into(),
                        });
                    }
                    if let Some(first_line) = seen.insert(node.text().to_owned(), node.at.line) {
                        return Err(SyntaxError {
                            at: node.at,
                            message: format!(
                                "duplicate key `{}` (first given at line {first_line})",
                                node.text(),
                            ),
                        });
                    }
                    *pending = Some(node);
                }
            },
        }
        Ok(())
    }
}

/// The position just after the last character of `text`; line breaks are YAML's (LF, CRLF,
/// CR).
fn end_of(text: &str) -> Location {
    let mut at = Location { line: 1, column: 1 };
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' || c == '\r' {
            if c == '\r' && chars.peek() == Some(&'\n') {
                chars.next();
            }
            at = Location {
                line: at.line + 1,
                column: 1,
            };
        } else {
            at.column += 1;
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(line: usize, column: usize) -> Location {
        Location { line, column }
    }

    #[test]
    fn builds_tree_with_positions() {
        let doc = "a: 1\nb:\n  - x\n  - 'y'\nc: {d: e}\n";
        let root = parse(doc).unwrap();
        assert_eq!(root.at, loc(1, 1));
        let Kind::Map(entries) = &root.kind else {
            panic!("not a map")
        };
        assert_eq!(entries.len(), 3);
        assert_eq!((entries[0].0.text(), entries[0].0.at), ("a", loc(1, 1)));
        assert_eq!((entries[0].1.text(), entries[0].1.at), ("1", loc(1, 4)));
        let Kind::Seq(items) = &entries[1].1.kind else {
            panic!("not a seq")
        };
        assert_eq!(items[0].at, loc(3, 5));
        assert_eq!(
            items[1].kind,
            Kind::Scalar {
                text: "y".into(),
                plain: false
            }
        );
        assert_eq!(items[1].at, loc(4, 5));
        let Kind::Map(inner) = &entries[2].1.kind else {
            panic!("not a map")
        };
        assert_eq!(entries[2].1.at, loc(5, 4));
        assert_eq!((inner[0].1.text(), inner[0].1.at), ("e", loc(5, 8)));
    }

    #[test]
    fn locations_stay_inside_the_text() {
        // Found by fuzz/config_yaml: an empty explicit key at the end of a text that ends
        // without a line break was placed on line 5 of a 4-line text (CR breaks lines).
        let root = parse("?\r\r\r#\x02").unwrap();
        let Kind::Map(entries) = &root.kind else {
            panic!("not a map")
        };
        assert_eq!(entries[0].0.at, loc(4, 3));
        assert_eq!(end_of("a\r\nb\rc\n"), loc(4, 1));
        assert_eq!(end_of(""), loc(1, 1));
    }

    #[test]
    fn empty_document_is_empty_map() {
        for doc in ["", "# only a comment\n", "---\n", "~\n"] {
            assert_eq!(parse(doc).unwrap().kind, Kind::Map(Vec::new()), "{doc:?}");
        }
    }

    #[test]
    fn rejects_what_the_schema_does_not_use() {
        let cases: &[(&str, Location, &str)] = &[
            (
                "a: 1\na: 2\n",
                loc(2, 1),
                "duplicate key `a` (first given at line 1)",
            ),
            ("a: &x 1\nb: *x\n", loc(2, 4), "aliases"),
            ("a: !!str 1\n", loc(1, 4), "tags"),
            ("a: 1\n---\nb: 2\n", loc(2, 1), "only one YAML document"),
            (
                "? [a]\n: 1\n",
                loc(1, 3),
                "mapping keys must be plain names",
            ),
            ("a: [1, 2\n", loc(2, 1), "YAML syntax error"),
            // Found by fuzz/config_yaml: no final newline, the error is at the end of line 3
            // (the scanner said line 4 of a 3-line text).
            ("lstdners:\n{ transpor:\n  -c nq", loc(3, 8), "YAML syntax error"),
            ("a:\n\tb: 1\n", loc(2, 2), "tabs disallowed"),
            ("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n", loc(1, 33), "nest deeper than 32"),
        ];
        for (doc, at, fragment) in cases {
            let err = parse(doc).unwrap_err();
            assert!(err.message.contains(fragment), "{doc:?}: {}", err.message);
            assert_eq!(err.at, *at, "{doc:?}: {}", err.message);
        }
    }
}
