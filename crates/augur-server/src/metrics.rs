//! `GET /metrics` through the `metrics` crate and its Prometheus exporter: counters of requests, tokens and
//! speculation, and latency histograms.
//!
//! The recorder belongs to the server (not installed globally), so that several servers in one process, as in
//! tests, keep their own numbers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use augur::generation::output::GenerationStats;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

const LATENCY_BUCKETS: [f64; 15] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
const TOKENS_PER_FORWARD_BUCKETS: [f64; 12] = [1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0];

const TTFT: &str = "augur_time_to_first_token_seconds";
const ITL: &str = "augur_inter_token_latency_seconds";
const E2E: &str = "augur_e2e_request_latency_seconds";
const QUEUE: &str = "augur_queue_time_seconds";
const PER_FORWARD: &str = "augur_tokens_per_target_forward";

/// The timings of one choice of a generation request.
pub struct Timings {
    /// From the request's arrival to a sequence slot.
    pub queue: Duration,
    /// From the arrival to the first text (`None`: no text came).
    pub first_token: Option<Duration>,
    /// From the arrival to the end.
    pub total: Duration,
}

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Totals for the acceptance-rate gauge.
    drafted: AtomicU64,
    accepted: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        let builder = PrometheusBuilder::new();
        let builder = [TTFT, ITL, E2E, QUEUE]
            .into_iter()
            .try_fold(builder, |b, name| b.set_buckets_for_metric(Matcher::Full(name.into()), &LATENCY_BUCKETS))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(PER_FORWARD.into()), &TOKENS_PER_FORWARD_BUCKETS))
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let m = Metrics { recorder, handle, drafted: AtomicU64::new(0), accepted: AtomicU64::new(0) };
        m.with(|| {
            describe_counter!("augur_requests_total", "HTTP requests answered, by status.");
            describe_counter!("augur_generations_total", "Generations run (one per choice).");
            describe_counter!("augur_cancelled_total", "Generations stopped by a client that left.");
            describe_counter!("augur_prompt_tokens_total", "Prompt tokens processed.");
            describe_counter!("augur_generation_tokens_total", "Tokens generated.");
            describe_counter!("augur_draft_tokens_total", "Draft tokens proposed.");
            describe_counter!("augur_accepted_tokens_total", "Draft tokens accepted.");
            describe_counter!("augur_target_forwards_total", "Target forward passes.");
            describe_gauge!("augur_draft_seconds_total", Unit::Seconds, "Seconds spent drafting.");
            describe_gauge!("augur_verify_seconds_total", Unit::Seconds, "Seconds spent in target forwards.");
            describe_gauge!("augur_acceptance_rate", "Accepted ÷ drafted tokens since start.");
            describe_gauge!("augur_active_sequences", "Sequences generating now.");
            describe_gauge!("augur_queue_depth", "Requests waiting for a sequence slot.");
            describe_histogram!(TTFT, Unit::Seconds, "From a request's arrival to its first text.");
            describe_histogram!(ITL, Unit::Seconds, "A choice's mean time per token after its first.");
            describe_histogram!(E2E, Unit::Seconds, "From a generation request's arrival to its last token.");
            describe_histogram!(QUEUE, Unit::Seconds, "From a request's arrival to its sequence slot.");
            describe_histogram!(PER_FORWARD, "A choice's new tokens per target forward.");
            // Registered now, so that a scrape before the first generation sees them at 0.
            for name in [
                "augur_generations_total",
                "augur_cancelled_total",
                "augur_prompt_tokens_total",
                "augur_generation_tokens_total",
                "augur_draft_tokens_total",
                "augur_accepted_tokens_total",
                "augur_target_forwards_total",
            ] {
                counter!(name).increment(0);
            }
            for name in ["augur_draft_seconds_total", "augur_verify_seconds_total"] {
                gauge!(name).increment(0.0);
            }
        });
        m
    }
}

impl Metrics {
    fn with(&self, f: impl FnOnce()) {
        metrics::with_local_recorder(&self.recorder, f);
    }

    pub fn request(&self, status: u16) {
        self.with(|| counter!("augur_requests_total", "status" => status.to_string()).increment(1));
    }

    /// One finished choice.
    pub fn generation(&self, s: &GenerationStats, cancelled: bool, t: &Timings) {
        self.drafted.fetch_add(s.drafted as u64, Ordering::Relaxed);
        self.accepted.fetch_add(s.accepted as u64, Ordering::Relaxed);
        self.with(|| {
            counter!("augur_generations_total").increment(1);
            counter!("augur_cancelled_total").increment(cancelled as u64);
            counter!("augur_prompt_tokens_total").increment(s.prompt_tokens as u64);
            counter!("augur_generation_tokens_total").increment(s.new_tokens as u64);
            counter!("augur_draft_tokens_total").increment(s.drafted as u64);
            counter!("augur_accepted_tokens_total").increment(s.accepted as u64);
            counter!("augur_target_forwards_total").increment(s.target_forwards as u64);
            gauge!("augur_draft_seconds_total").increment(s.draft_seconds);
            gauge!("augur_verify_seconds_total").increment(s.verify_seconds);
            histogram!(QUEUE).record(t.queue.as_secs_f64());
            histogram!(E2E).record(t.total.as_secs_f64());
            if let Some(first) = t.first_token {
                histogram!(TTFT).record(first.as_secs_f64());
                if s.new_tokens > 1 {
                    histogram!(ITL).record((t.total - first).as_secs_f64() / (s.new_tokens - 1) as f64);
                }
            }
            if s.target_forwards > 0 {
                histogram!(PER_FORWARD).record(s.new_tokens as f64 / s.target_forwards as f64);
            }
        });
    }

    /// The exposition text; `active` and `queued` are the scheduler's gauges now.
    pub fn render(&self, active: usize, queued: usize) -> String {
        let (d, a) = (self.drafted.load(Ordering::Relaxed), self.accepted.load(Ordering::Relaxed));
        self.with(|| {
            gauge!("augur_active_sequences").set(active as f64);
            gauge!("augur_queue_depth").set(queued as f64);
            gauge!("augur_acceptance_rate").set(if d > 0 { a as f64 / d as f64 } else { 0.0 });
        });
        self.handle.render()
    }
}
