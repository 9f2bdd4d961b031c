//! Counters for `GET /metrics`, in Prometheus' text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use augur::generation::output::GenerationStats;

#[derive(Default)]
struct Totals {
    /// Finished requests by HTTP status.
    requests: BTreeMap<u16, u64>,
    prompt_tokens: u64,
    generated_tokens: u64,
    drafted: u64,
    accepted: u64,
    target_forwards: u64,
    draft_seconds: f64,
    verify_seconds: f64,
    request_seconds: f64,
    generations: u64,
    cancelled: u64,
}

#[derive(Default)]
pub struct Metrics {
    totals: Mutex<Totals>,
}

impl Metrics {
    fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn request(&self, status: u16) {
        *self.totals().requests.entry(status).or_default() += 1;
    }

    pub fn generation(&self, s: &GenerationStats, cancelled: bool) {
        let mut t = self.totals();
        t.prompt_tokens += s.prompt_tokens as u64;
        t.generated_tokens += s.new_tokens as u64;
        t.drafted += s.drafted as u64;
        t.accepted += s.accepted as u64;
        t.target_forwards += s.target_forwards as u64;
        t.draft_seconds += s.draft_seconds;
        t.verify_seconds += s.verify_seconds;
        t.request_seconds += s.seconds;
        t.generations += 1;
        t.cancelled += cancelled as u64;
    }

    /// The exposition text; `active` and `queued` are the scheduler's gauges now.
    pub fn render(&self, active: usize, queued: usize) -> String {
        let t = self.totals();
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            let _ = writeln!(out, "# HELP augur_{name} {help}\n# TYPE augur_{name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "augur_{name}{labels} {value}");
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        let requests: Vec<_> =
            t.requests.iter().map(|(status, n)| (format!("{{status=\"{status}\"}}"), n.to_string())).collect();
        metric("requests_total", "counter", "HTTP requests answered, by status.", &requests);
        metric("generations_total", "counter", "Generations run.", &one(t.generations.to_string()));
        metric(
            "cancelled_total",
            "counter",
            "Generations stopped by a client that left.",
            &one(t.cancelled.to_string()),
        );
        metric("prompt_tokens_total", "counter", "Prompt tokens processed.", &one(t.prompt_tokens.to_string()));
        metric("generation_tokens_total", "counter", "Tokens generated.", &one(t.generated_tokens.to_string()));
        metric("draft_tokens_total", "counter", "Draft tokens proposed.", &one(t.drafted.to_string()));
        metric("accepted_tokens_total", "counter", "Draft tokens accepted.", &one(t.accepted.to_string()));
        let rate = if t.drafted > 0 { t.accepted as f64 / t.drafted as f64 } else { 0.0 };
        metric("acceptance_rate", "gauge", "Accepted ÷ drafted tokens since start.", &one(rate.to_string()));
        metric("target_forwards_total", "counter", "Target forward passes.", &one(t.target_forwards.to_string()));
        metric("draft_seconds_total", "counter", "Seconds spent drafting.", &one(t.draft_seconds.to_string()));
        metric(
            "verify_seconds_total",
            "counter",
            "Seconds spent in target forwards.",
            &one(t.verify_seconds.to_string()),
        );
        metric("generation_seconds_total", "counter", "Seconds spent generating.", &one(t.request_seconds.to_string()));
        metric("active_sequences", "gauge", "Sequences generating now.", &one(active.to_string()));
        metric("queue_depth", "gauge", "Requests waiting for a sequence slot.", &one(queued.to_string()));
        out
    }
}
