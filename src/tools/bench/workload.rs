//! What bench sends and when: the prompts (a JSONL file or the synthetic one), each request's
//! `max_tokens` (fixed or drawn from a seeded distribution), the request bodies, and the Poisson
//! arrival times of an open-loop level.
//!
//! Everything drawn here depends only on `--seed` and the request's index within its level, never
//! on which task sends it or when, so every level (and both targets of `--compare`) get the same
//! requests and a run reproduces.

use std::fmt::{self, Write as _};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use super::request::{Api, Endpoint};

/// The largest `max_tokens` bench asks for (the sim's own limit).
pub const MAX_TOKENS_LIMIT: u32 = 65_536;

/// How each request's `max_tokens` is chosen (`--max-tokens`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MaxTokens {
    /// `N`: every request asks for N.
    Fixed(u32),
    /// `uniform:A-B`: a whole number from A to B inclusive, each equally likely.
    Uniform(u32, u32),
    /// `normal:MEAN,SD`: rounded, clamped to 1..=65536.
    Normal(f64, f64),
    /// `exp:MEAN`: exponential with that mean, rounded, clamped to 1..=65536.
    Exp(f64),
}

impl MaxTokens {
    /// The `max_tokens` of request `index` (within its level) under `seed`.
    pub fn draw(&self, seed: u64, index: u32) -> u32 {
        let mut rng = fastrand::Rng::with_seed(mix(seed, u64::from(index)));
        let clamp = |x: f64| x.round().clamp(1.0, f64::from(MAX_TOKENS_LIMIT)) as u32;
        match *self {
            MaxTokens::Fixed(n) => n,
            MaxTokens::Uniform(lo, hi) => rng.u32(lo..=hi),
            MaxTokens::Normal(mean, sd) => {
                // Box-Muller; 1 - f64() is in (0, 1], so the logarithm is finite.
                let (u, v) = (1.0 - rng.f64(), rng.f64());
                let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
                clamp(mean + sd * z)
            }
            MaxTokens::Exp(mean) => clamp(-mean * (1.0 - rng.f64()).ln()),
        }
    }
}

impl fmt::Display for MaxTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxTokens::Fixed(n) => write!(f, "{n}"),
            MaxTokens::Uniform(a, b) => write!(f, "uniform:{a}-{b}"),
            MaxTokens::Normal(m, s) => write!(f, "normal:{m},{s}"),
            MaxTokens::Exp(m) => write!(f, "exp:{m}"),
        }
    }
}

impl FromStr for MaxTokens {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let count = |s: &str| -> Result<u32, String> {
            match s.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => Ok(n),
                _ => Err(format!(
                    "`{s}` in `{text}` is not a token count from 1 to {MAX_TOKENS_LIMIT}"
                )),
            }
        };
        let real = |s: &str, what: &str| -> Result<f64, String> {
            match s.trim().parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
                _ => Err(format!("`{s}` in `{text}` is not a {what} (a number >= 0)")),
            }
        };
        let (kind, params) = match text.split_once(':') {
            None => return count(text).map(MaxTokens::Fixed),
            Some(split) => split,
        };
        match kind {
            "uniform" => {
                let (a, b) = params.split_once('-').ok_or_else(|| {
                    format!("`{text}`: write uniform:MIN-MAX, e.g. uniform:16-256")
                })?;
                let (a, b) = (count(a)?, count(b)?);
                if a > b {
                    return Err(format!("`{text}`: the minimum is above the maximum"));
                }
                Ok(MaxTokens::Uniform(a, b))
            }
            "normal" => {
                let (m, s) = params
                    .split_once(',')
                    .ok_or_else(|| format!("`{text}`: write normal:MEAN,SD, e.g. normal:128,32"))?;
                Ok(MaxTokens::Normal(
                    real(m, "mean")?,
                    real(s, "standard deviation")?,
                ))
            }
            "exp" => {
                let mean = real(params, "mean")?;
                if mean < 1.0 {
                    return Err(format!("`{text}`: the mean must be at least 1"));
                }
                Ok(MaxTokens::Exp(mean))
            }
            _ => Err(format!(
                "`{text}` is not N, uniform:MIN-MAX, normal:MEAN,SD or exp:MEAN"
            )),
        }
    }
}

/// splitmix64 of the seed and an index, so neighbouring indices get unrelated streams.
fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One prompt: the JSON text of its `messages` array, and the `max_tokens` its line fixed.
#[derive(Clone, Debug, PartialEq)]
pub struct Prompt {
    messages: String,
    /// The JSON string of the prompt for the completions endpoint: the line's `prompt`, or its
    /// messages' text contents one a line.
    text: String,
    max_tokens: Option<u32>,
}

impl Prompt {
    /// A single user message.
    pub fn user(content: &str) -> Prompt {
        Prompt {
            messages: serde_json::json!([{"role": "user", "content": content}]).to_string(),
            text: Value::String(content.to_owned()).to_string(),
            max_tokens: None,
        }
    }
}

/// Reads a prompts file: one JSON object per line, `{"prompt": "..."}` or `{"messages": [...]}`
/// (OpenAI chat), each with an optional `max_tokens`. Blank lines are skipped. The error is one
/// line, `FILE:LINE: problem`.
pub fn load_prompts(path: &Path) -> Result<Vec<Prompt>, String> {
    let name = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{name}: {e}"))?;
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        prompts.push(parse_prompt(line).map_err(|e| format!("{name}:{}: {e}", i + 1))?);
    }
    if prompts.is_empty() {
        return Err(format!("{name}: no prompts (one JSON object per line)"));
    }
    Ok(prompts)
}

fn parse_prompt(line: &str) -> Result<Prompt, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(object) = value else {
        return Err("not a JSON object".into());
    };
    if let Some(key) = object
        .keys()
        .find(|k| !matches!(k.as_str(), "prompt" | "messages" | "max_tokens"))
    {
        return Err(format!(
            "unknown field `{key}` (expected `prompt` or `messages`, and `max_tokens`)"
        ));
    }
    let max_tokens = match object.get("max_tokens") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u64::from(MAX_TOKENS_LIMIT)).contains(&n) => Some(n as u32),
            _ => {
                return Err(format!(
                    "`max_tokens` must be an integer from 1 to {MAX_TOKENS_LIMIT}, not {v}"
                ))
            }
        },
    };
    let (messages, text) = match (object.get("prompt"), object.get("messages")) {
        (Some(_), Some(_)) => return Err("has both `prompt` and `messages`".into()),
        (None, None) => return Err("has neither `prompt` nor `messages`".into()),
        (Some(Value::String(text)), None) => {
            let p = Prompt::user(text);
            (p.messages, p.text)
        }
        (Some(_), None) => return Err("`prompt` must be a string".into()),
        (None, Some(Value::Array(list))) => {
            if list.is_empty() {
                return Err("`messages` is empty".into());
            }
            for (j, m) in list.iter().enumerate() {
                if !m.get("role").is_some_and(Value::is_string) {
                    return Err(format!("`messages[{j}]` has no string `role`"));
                }
            }
            let text: Vec<&str> = list
                .iter()
                .filter_map(|m| m.get("content").and_then(Value::as_str))
                .collect();
            (
                Value::Array(list.clone()).to_string(),
                Value::String(text.join("\n")).to_string(),
            )
        }
        (None, Some(_)) => return Err("`messages` must be an array".into()),
    };
    Ok(Prompt {
        messages,
        text,
        max_tokens,
    })
}

/// Builds every request of a level: request `i` uses prompt `i mod len` and its own `max_tokens`
/// draw. Each prompt's JSON is rendered once; a request costs one small allocation.
#[derive(Debug)]
pub struct Workload {
    /// Each prompt's body up to the `max_tokens` value, and that line's own `max_tokens`.
    heads: Vec<(String, Option<u32>)>,
    max_tokens: MaxTokens,
    seed: u64,
}

impl Workload {
    pub fn new(model: &str, prompts: Vec<Prompt>, max_tokens: MaxTokens, seed: u64) -> Workload {
        Self::for_api(model, prompts, max_tokens, seed, Api::default())
    }

    /// [`Workload::new`] for `api`: chat bodies carry `messages`, completions bodies `prompt`;
    /// a streamed request asks for the final usage, a non-streamed one gets it in its body.
    pub fn for_api(
        model: &str,
        prompts: Vec<Prompt>,
        max_tokens: MaxTokens,
        seed: u64,
        api: Api,
    ) -> Workload {
        let model = Value::String(model.to_owned()).to_string();
        let stream = if api.stream {
            r#""stream":true,"stream_options":{"include_usage":true}"#
        } else {
            r#""stream":false"#
        };
        let heads = prompts
            .into_iter()
            .map(|p| {
                let input = match api.endpoint {
                    Endpoint::Chat => format!(r#""messages":{}"#, p.messages),
                    Endpoint::Completions => format!(r#""prompt":{}"#, p.text),
                };
                let head = format!(r#"{{"model":{model},{input},{stream},"max_tokens":"#);
                (head, p.max_tokens)
            })
            .collect();
        Workload {
            heads,
            max_tokens,
            seed,
        }
    }

    /// The body of request `index` and the `max_tokens` it asks for.
    pub fn request(&self, index: u32) -> (Bytes, u32) {
        let (head, fixed) = &self.heads[index as usize % self.heads.len().max(1)];
        let max_tokens = fixed.unwrap_or_else(|| self.max_tokens.draw(self.seed, index));
        let mut body = String::with_capacity(head.len() + 8);
        body.push_str(head);
        let _ = write!(body, "{max_tokens}}}");
        (Bytes::from(body), max_tokens)
    }
}

/// Poisson arrivals at `rate` per second: exponential gaps from a seeded generator.
pub struct Arrivals {
    rng: fastrand::Rng,
    mean_secs: f64,
}

impl Arrivals {
    pub fn new(rate: f64, seed: u64) -> Arrivals {
        Arrivals {
            rng: fastrand::Rng::with_seed(mix(seed, u64::MAX)),
            mean_secs: 1.0 / rate.max(f64::MIN_POSITIVE),
        }
    }

    /// The gap before the next arrival.
    pub fn gap(&mut self) -> Duration {
        let secs = -self.mean_secs * (1.0 - self.rng.f64()).ln();
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tokens_flags_parse_and_bad_ones_say_why() {
        assert_eq!("64".parse(), Ok(MaxTokens::Fixed(64)));
        assert_eq!("uniform:16-256".parse(), Ok(MaxTokens::Uniform(16, 256)));
        assert_eq!("normal:128,32".parse(), Ok(MaxTokens::Normal(128.0, 32.0)));
        assert_eq!("exp:100".parse(), Ok(MaxTokens::Exp(100.0)));
        for bad in [
            "0",
            "uniform:9-3",
            "uniform:5",
            "normal:1",
            "exp:0.5",
            "zipf:3",
            "x",
        ] {
            let e = bad.parse::<MaxTokens>().expect_err(bad);
            assert!(e.contains(bad.split(':').next().unwrap_or(bad)), "{e}");
        }
    }

    #[test]
    fn draws_are_seeded_bounded_and_have_the_asked_mean() {
        let mean = |d: MaxTokens, seed| {
            (0..20_000).map(|i| f64::from(d.draw(seed, i))).sum::<f64>() / 20_000.0
        };
        let uniform = MaxTokens::Uniform(10, 30);
        assert!((0..1000).all(|i| (10..=30).contains(&uniform.draw(1, i))));
        assert!((mean(uniform, 1) - 20.0).abs() < 0.5);
        assert!((mean(MaxTokens::Normal(100.0, 10.0), 1) - 100.0).abs() < 1.0);
        assert!((mean(MaxTokens::Exp(50.0), 1) - 50.0).abs() < 2.0);
        // Clamped, never 0, even when most of the distribution lies below 1.
        assert!((0..1000).all(|i| MaxTokens::Normal(0.0, 5.0).draw(3, i) >= 1));
        let seq = |seed| (0..50).map(|i| uniform.draw(seed, i)).collect::<Vec<_>>();
        assert_eq!(seq(7), seq(7), "same seed, same draws");
        assert_ne!(seq(7), seq(8), "another seed, other draws");
    }

    #[test]
    fn completions_and_unstreamed_bodies_carry_the_prompt_text_and_stream_false() {
        let lines = "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}]}";
        let prompts = vec![parse_prompt(lines).expect("a valid line")];
        let api = Api {
            endpoint: Endpoint::Completions,
            stream: false,
        };
        let w = Workload::for_api("m", prompts, MaxTokens::Fixed(3), 1, api);
        let body: Value = serde_json::from_slice(&w.request(0).0).expect("JSON body");
        assert_eq!(body["prompt"], "be brief\nhi");
        assert_eq!(body["stream"], false);
        assert!(body.get("messages").is_none() && body.get("stream_options").is_none());
        assert_eq!(Endpoint::of_path("/v1/completions"), Endpoint::Completions);
        assert_eq!(Endpoint::of_path("/v1/chat/completions"), Endpoint::Chat);
        assert_eq!(Endpoint::of_path("/"), Endpoint::Chat);
    }

    #[test]
    fn arrival_gaps_are_exponential_with_the_rate_s_mean() {
        let mut a = Arrivals::new(40.0, 1);
        let gaps: Vec<f64> = (0..20_000).map(|_| a.gap().as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((mean - 0.025).abs() < 0.025 * 0.03, "mean gap {mean}");
        // An exponential's standard deviation equals its mean (a fixed gap would have none).
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!(
            (var.sqrt() / mean - 1.0).abs() < 0.05,
            "sd/mean {}",
            var.sqrt() / mean
        );
        let mut b = Arrivals::new(40.0, 1);
        assert_eq!(b.gap().as_secs_f64(), gaps[0], "seeded");
    }

    #[test]
    fn prompt_lines_parse_and_bad_ones_name_the_line() {
        let dir = std::env::temp_dir().join(format!("tm-prompts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let good = dir.join("good.jsonl");
        std::fs::write(
            &good,
            "{\"prompt\": \"hi\"}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"yo\"}], \"max_tokens\": 7}\n",
        )
        .expect("write");
        let prompts = load_prompts(&good).expect("valid file");
        assert_eq!(prompts.len(), 2);
        assert_eq!(prompts[1].max_tokens, Some(7));
        let w = Workload::new("m", prompts, MaxTokens::Fixed(3), 1);
        let body = |i| {
            let (b, n) = w.request(i);
            (serde_json::from_slice::<Value>(&b).expect("JSON body"), n)
        };
        let (first, n) = body(0);
        assert_eq!(n, 3);
        assert_eq!(first["messages"][0]["content"], "hi");
        assert_eq!(first["max_tokens"], 3);
        assert_eq!(first["stream"], true);
        assert_eq!(body(1).1, 7, "the line's own max_tokens wins");
        assert_eq!(body(2).0["messages"][0]["content"], "hi", "cycled");

        for (text, problem) in [
            ("{\"prompt\": \"a\"}\nnot json\n", ":2: not JSON"),
            ("{\"prompt\": 3}\n", ":1: `prompt` must be a string"),
            ("{\"messages\": []}\n", ":1: `messages` is empty"),
            (
                "{\"prompt\": \"a\", \"max_tokens\": 0}\n",
                ":1: `max_tokens` must be",
            ),
            ("{\"promt\": \"a\"}\n", ":1: unknown field `promt`"),
            ("\n\n", ": no prompts"),
        ] {
            let bad = dir.join("bad.jsonl");
            std::fs::write(&bad, text).expect("write");
            let e = load_prompts(&bad).expect_err(text);
            assert!(e.starts_with(&bad.display().to_string()), "{e}");
            assert!(e.contains(problem), "{e} should contain {problem}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
