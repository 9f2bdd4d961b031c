//! Chat templates: the model's Jinja template rendered with minijinja the way Transformers'
//! `apply_chat_template` renders it with Jinja2.
//!
//! Transformers renders with `trim_blocks=True, lstrip_blocks=True`, Python string methods
//! (`.strip()`, `.startswith()` …), `raise_exception`, `strftime_now` and a `tojson` that writes
//! Python's `json.dumps` (no HTML escaping, `", "` / `": "` separators). The variables are `messages`,
//! `add_generation_prompt`, `tools` / `documents` (none here) and the special tokens by name
//! (`bos_token`, `eos_token` …).
//!
//! The rendered text already contains whatever special tokens the template writes (often
//! `{{ bos_token }}`), so Transformers tokenizes it with `add_special_tokens=False`;
//! [`Tokenizer::encode_chat`] does the same.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use super::Tokenizer;
use crate::error::{Error, Result};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant" (or whatever the template understands).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

impl Tokenizer {
    /// Renders `messages` with the model's chat template. With `add_generation_prompt`, the text ends
    /// with the opening of an assistant turn, ready for generation.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self.chat_template().ok_or_else(|| {
            Error::ChatTemplate(
                "this model has no chat template (tokenizer_config.json `chat_template`, chat_template.jinja \
                 or GGUF `tokenizer.chat_template`); give a raw prompt instead"
                    .to_string(),
            )
        })?;
        render(template, messages, add_generation_prompt, self)
    }

    /// The chat template rendered and tokenized as Transformers does it: the rendered text is
    /// encoded WITHOUT adding special tokens, since the template writes them itself.
    pub fn encode_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>> {
        let text = self.apply_chat_template(messages, add_generation_prompt)?;
        self.encode(&text, false)
    }
}

fn template_error(e: minijinja::Error) -> Error {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    Error::ChatTemplate(msg)
}

fn render(template: &str, messages: &[ChatMessage], add_generation_prompt: bool, tok: &Tokenizer) -> Result<String> {
    let specials = [
        ("bos_token", tok.bos_token()),
        ("eos_token", tok.eos_token()),
        ("pad_token", tok.pad_token()),
        ("unk_token", tok.unk_token()),
    ];
    render_with(template, messages, add_generation_prompt, &specials)
}

/// Renders with the given special tokens as variables (absent ones stay undefined, as in
/// Transformers, which passes only the tokens the tokenizer has).
pub(crate) fn render_with(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    specials: &[(&str, Option<&str>)],
) -> Result<String> {
    let env = environment();
    let tmpl = env.template_from_str(template).map_err(template_error)?;
    let mut ctx = std::collections::BTreeMap::new();
    ctx.insert("messages", Value::from_serialize(messages));
    ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
    ctx.insert("tools", Value::from(()));
    ctx.insert("documents", Value::from(()));
    for (name, value) in specials {
        if let Some(v) = value {
            ctx.insert(name, Value::from(*v));
        }
    }
    let mut out = CappedWriter { text: Vec::new(), overflowed: false };
    let rendered = tmpl.render_captured_to(ctx, &mut out).map(drop);
    match rendered {
        Ok(()) => String::from_utf8(out.text).map_err(|e| Error::ChatTemplate(format!("rendered text: {e}"))),
        Err(_) if out.overflowed => {
            Err(Error::ChatTemplate(format!("the rendered text exceeds the limit of {MAX_RENDERED_BYTES} bytes")))
        }
        Err(e) => Err(template_error(e)),
    }
}

/// Instructions a template may run for one rendering: real templates take a few hundred per message, while a
/// template from a downloaded file can loop (nested `range`s) long enough to hang the loader.
const TEMPLATE_FUEL: u64 = 20_000_000;
/// Longest rendered prompt: far past any context window, and short of what a looping template could write.
const MAX_RENDERED_BYTES: usize = 1 << 26;

/// Collects the rendered text and fails the rendering once it passes [`MAX_RENDERED_BYTES`].
struct CappedWriter {
    text: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("rendered text too long"));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The Jinja environment Transformers builds (`ImmutableSandboxedEnvironment(trim_blocks=True,
/// lstrip_blocks=True)` plus its globals and filters).
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |format: String| -> std::result::Result<Value, minijinja::Error> {
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        strftime(&format, now).map(Value::from)
    });
    env.add_filter("tojson", tojson);
    // Python prints booleans and None capitalized.
    env.set_formatter(|out, state, value| match value.kind() {
        ValueKind::Bool => Ok(out.write_str(if value.is_true() { "True" } else { "False" })?),
        ValueKind::None => Ok(out.write_str("None")?),
        _ => minijinja::escape_formatter(out, state, value),
    });
    env
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`, which is
/// what Transformers installs as `tojson` (minijinja's own escapes `<`, `>`, `&` and `'`).
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "separators must be a pair")),
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    if indent.is_some_and(|n| n > MAX_JSON_INDENT) {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: indent exceeds the limit of {MAX_JSON_INDENT}"),
        ));
    }
    let opts = JsonOpts { indent, sort_keys: sort_keys.unwrap_or(false), item_sep, key_sep };
    let mut out = String::new();
    write_json(&value, &opts, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// Widest `tojson` indent: each line's indent is `indent × depth` spaces, so a template could ask for any amount
/// of memory through it.
const MAX_JSON_INDENT: usize = 64;
/// Deepest nesting `tojson` writes (it recurses once per level).
const MAX_JSON_DEPTH: usize = 256;

struct JsonOpts {
    indent: Option<usize>,
    sort_keys: bool,
    item_sep: String,
    key_sep: String,
}

fn write_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_json(v: &Value, o: &JsonOpts, depth: usize, out: &mut String) -> std::result::Result<(), minijinja::Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: nesting deeper than {MAX_JSON_DEPTH}"),
        ));
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = o.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = v.as_i64() {
                out.push_str(&i.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else if f.is_nan() {
                    out.push_str("NaN");
                } else if f.is_infinite() {
                    out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&f.to_string());
                }
            }
        }
        ValueKind::String => write_json_string(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, depth + 1);
                write_json(item, o, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if o.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(s) => write_json_string(s, out),
                    None => write_json_string(&k.to_string(), out),
                }
                out.push_str(&o.key_sep);
                write_json(&v.get_item(k)?, o, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => write_json_string(&v.to_string(), out),
    }
    Ok(())
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), Howard Hinnant's civil_from_days.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// (year, month, day) → days since 1970-01-01, Howard Hinnant's days_from_civil.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Python's `datetime.now().strftime(format)` for the directives chat templates use, in UTC (the
/// machine's time zone is not known without a dependency).
fn strftime(format: &str, unix_secs: i64) -> std::result::Result<String, minijinja::Error> {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(directive) = chars.next() else {
            out.push('%');
            break;
        };
        match directive {
            'Y' => out.push_str(&y.to_string()),
            'y' => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            'm' => out.push_str(&format!("{m:02}")),
            'd' => out.push_str(&format!("{d:02}")),
            '-' => match chars.next() {
                Some('d') => out.push_str(&d.to_string()),
                Some('m') => out.push_str(&m.to_string()),
                Some('H') => out.push_str(&hh.to_string()),
                other => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        format!("strftime_now: unsupported directive %-{}", other.unwrap_or(' ')),
                    ))
                }
            },
            'B' => out.push_str(MONTHS[(m - 1) as usize]),
            'b' | 'h' => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'H' => out.push_str(&format!("{hh:02}")),
            'I' => out.push_str(&format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 })),
            'p' => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            'M' => out.push_str(&format!("{mm:02}")),
            'S' => out.push_str(&format!("{ss:02}")),
            'j' => out.push_str(&format!("{yday:03}")),
            'F' => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            'T' => out.push_str(&format!("{hh:02}:{mm:02}:{ss:02}")),
            '%' => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported directive %{other}"),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::byte_level_tokenizer;

    /// Qwen2.5's published template (the fuzz seed cut from the real GGUF: the template, then a NUL).
    fn qwen_template() -> String {
        let seed = include_bytes!("../../../../fuzz/seeds/chat_template/qwen2.5-coder-0.5b-instruct");
        let end = seed.iter().position(|&b| b == 0).unwrap();
        String::from_utf8(seed[..end].to_vec()).unwrap()
    }

    #[test]
    fn a_long_conversation_renders_within_the_fuel() {
        let msgs: Vec<ChatMessage> =
            (0..20_000)
                .map(|i| {
                    if i % 2 == 0 {
                        ChatMessage::user(format!("q{i}"))
                    } else {
                        ChatMessage::assistant(format!("a{i}"))
                    }
                })
                .collect();
        let specials = [("eos_token", Some("<|endoftext|>"))];
        let text = render_with(&qwen_template(), &msgs, true, &specials).unwrap();
        assert!(text.ends_with("a19999<|im_end|>\n<|im_start|>assistant\n"), "{}", &text[text.len() - 80..]);
    }

    #[test]
    fn looping_templates_are_stopped() {
        let forever = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
        let e = render_with(forever, &[], false, &[]).unwrap_err().to_string();
        assert!(e.contains("fuel"), "{e}");
        let long = "{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}";
        let e = render_with(long, &[], false, &[]).unwrap_err().to_string();
        assert!(e.contains("exceeds the limit of 67108864 bytes"), "{e}");
        let wide = "{{ messages | tojson(indent=1000000000000) }}";
        let e = render_with(wide, &[ChatMessage::user("hi")], false, &[]).unwrap_err().to_string();
        assert!(e.contains("tojson: indent exceeds the limit"), "{e}");
    }

    #[test]
    fn chatml_rendering() {
        let tok = byte_level_tokenizer();
        let msgs = [ChatMessage::system("Be brief."), ChatMessage::user("Hi!")];
        let text = tok.apply_chat_template(&msgs, true).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
        );
        let without = tok.apply_chat_template(&msgs, false).unwrap();
        assert!(!without.ends_with("assistant\n"));
        // Rendered text is tokenized without adding special tokens again.
        let ids = tok.encode_chat(&msgs, true).unwrap();
        assert_eq!(ids, tok.encode(&text, false).unwrap());
        assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap());
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        let mut tok = byte_level_tokenizer();
        // Qwen-style template with `{%-`, block tags on their own indented lines and python methods.
        tok.set_chat_template(Some(
            "{%- for message in messages %}\n    {%- if message.role == 'system' %}\n        {{- '[S]' + message.content.strip() }}\n    {%- else %}\n        {{- '[' + message['role'].upper() + ']' + message.content }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '[A]' }}\n{%- endif %}\n".into(),
        ));
        let text = tok.apply_chat_template(&[ChatMessage::system("  sys  "), ChatMessage::user("u")], true).unwrap();
        assert_eq!(text, "[S]sys[USER]u[A]");
        // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
        tok.set_chat_template(Some("{% for m in messages %}\n  {% if m.content.startswith('x') %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}".into()));
        let text = tok
            .apply_chat_template(&[ChatMessage::user("xa"), ChatMessage::user("b"), ChatMessage::user("xc")], false)
            .unwrap();
        assert_eq!(text, "xa\nxc\n");
    }

    #[test]
    fn special_tokens_tools_and_tojson() {
        let mut tok = byte_level_tokenizer();
        tok.set_chat_template(Some(
            "{{ eos_token }}|{{ bos_token }}|{% if tools %}T{% else %}N{% endif %}|{{ messages[0] | tojson }}|{{ {'a': [1, 2.5, none, true], 'b': '<&>é'} | tojson(indent=2) }}".into(),
        ));
        let text = tok.apply_chat_template(&[ChatMessage::user("q\"x")], false).unwrap();
        assert_eq!(
            text,
            "<|im_end|>||N|{\"role\": \"user\", \"content\": \"q\\\"x\"}|{\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"b\": \"<&>é\"\n}"
        );
    }

    #[test]
    fn raise_exception_and_missing_template() {
        let mut tok = byte_level_tokenizer();
        tok.set_chat_template(Some(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok".into(),
        ));
        let err = tok.apply_chat_template(&[ChatMessage::assistant("a")], false).unwrap_err();
        assert!(matches!(err, Error::ChatTemplate(ref m) if m.contains("first must be user")), "{err}");
        assert_eq!(tok.apply_chat_template(&[ChatMessage::user("a")], false).unwrap(), "ok");
        tok.set_chat_template(Some("{% if %}".into()));
        assert!(matches!(tok.apply_chat_template(&[], false), Err(Error::ChatTemplate(_))));
        tok.set_chat_template(None);
        let err = tok.apply_chat_template(&[ChatMessage::user("a")], true).unwrap_err();
        assert!(matches!(err, Error::ChatTemplate(ref m) if m.contains("no chat template")), "{err}");
    }

    /// Templates in `testdata/` rendered by Jinja2 with Transformers' environment
    /// (`testdata/render_chat.py` writes `chat_expected.jsonl`); minijinja must agree exactly.
    #[test]
    fn templates_render_like_jinja2() {
        let templates = [
            ("gemma", include_str!("testdata/gemma.jinja")),
            ("llama", include_str!("testdata/llama.jinja")),
            ("misc", include_str!("testdata/misc.jinja")),
        ];
        let convs = [
            vec![
                ChatMessage::system("  Be terse.\n"),
                ChatMessage::user("Hi a b!"),
                ChatMessage::assistant("Hello.\n\n"),
                ChatMessage::user("  日本語? 😀\n"),
            ],
            vec![ChatMessage::user("only user")],
        ];
        let specials = [("bos_token", Some("<bos>")), ("eos_token", Some("<eos>"))];
        let mut checked = 0;
        for line in include_str!("testdata/chat_expected.jsonl").lines() {
            let (name, conv, agp, expected): (String, usize, bool, String) = serde_json::from_str(line).unwrap();
            let template = templates.iter().find(|(n, _)| *n == name).unwrap().1;
            let got = render_with(template, &convs[conv], agp, &specials).unwrap();
            assert_eq!(got, expected, "template {name}, conversation {conv}, add_generation_prompt {agp}");
            checked += 1;
        }
        assert_eq!(checked, 12);
        // Gemma's template refuses non-alternating roles through raise_exception.
        let err = render_with(templates[0].1, &[ChatMessage::user("a"), ChatMessage::user("b")], false, &specials)
            .unwrap_err();
        assert!(err.to_string().contains("Conversation roles must alternate"), "{err}");
    }

    #[test]
    fn strftime_directives() {
        // 2024-07-23 14:05:09 UTC, a Tuesday, day 205 of a leap year.
        let t = 1_721_743_509;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "23 Jul 2024");
        assert_eq!(strftime("%A %B %-d, %H:%M:%S %j %y %%", t).unwrap(), "Tuesday July 23, 14:05:09 205 24 %");
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(strftime("%j", 0).unwrap(), "001");
        assert!(strftime("%Q", 0).is_err());
        let mut tok = byte_level_tokenizer();
        tok.set_chat_template(Some("{{ strftime_now('%Y') | length }}".into()));
        assert_eq!(tok.apply_chat_template(&[], false).unwrap(), "4");
    }
}
