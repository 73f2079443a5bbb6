//! The simulated inference engine: one scheduler task that owns the running batch.
//!
//! It models continuous batching the way vLLM does it, with one clock (tokio's, so tests can
//! pause it). Requests wait in a bounded queue; at most `max_batch` run. Each iteration (a
//! *step*) first drops requests whose client has gone, then admits waiting requests into free
//! slots, then sleeps for the step time and emits one token to every running request. The step
//! time is `decode_step + decode_step_per_request × batch_size`, plus the prefill of every request
//! admitted in that step (`prefill_base + prompt_tokens × prefill_per_token`): prefill is done
//! inside the step, so it delays the whole batch (as vLLM's mixed prefill/decode steps do) and a
//! request's first token comes at the end of the step that admitted it. Hence TTFT grows with the
//! prompt and with the queue, TPOT grows with the batch, and throughput flattens once the batch
//! is full. Steps are slept on tokio's timer, whose resolution is 1 ms, so a step time that is
//! not a whole number of milliseconds ends at the next millisecond. A request's faults (an error, a stall, a dropped connection) happen after half of its
//! tokens, rounded down.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How many requests may wait for a slot; past this the server answers 429, so the queue is
/// bounded however hard it is driven.
pub const QUEUE_CAPACITY: usize = 4096;

/// The timing parameters of the engine (a subset of `SimConfig`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub max_batch: usize,
    pub prefill_base: Duration,
    pub prefill_per_token: Duration,
    pub decode_step: Duration,
    pub decode_step_per_request: Duration,
    /// How long a stalled request pauses, once.
    pub stall: Duration,
}

impl Timing {
    /// The prefill cost a request adds to the step that admits it.
    pub fn prefill(&self, prompt_tokens: u32) -> Duration {
        self.prefill_base
            .saturating_add(self.prefill_per_token.saturating_mul(prompt_tokens))
    }

    /// The decode cost of one step with `batch` running requests.
    pub fn step(&self, batch: usize) -> Duration {
        let batch = u32::try_from(batch).unwrap_or(u32::MAX);
        self.decode_step
            .saturating_add(self.decode_step_per_request.saturating_mul(batch))
    }
}

/// A fault decided for a request when it arrives; it strikes after half of its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The stream ends with an error event (vLLM's mid-stream error).
    MidstreamError,
    /// The stream pauses for `stall` once; its slot stays occupied meanwhile.
    Stall,
    /// The connection is closed without finishing the body.
    Drop,
}

/// What the engine tells a request's response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The token with this index (0-based) was generated.
    Token(u32),
    /// All `max_tokens` were generated.
    Done,
    /// A mid-stream error: no more tokens will come.
    Failed,
    /// The connection must be cut without ending the body.
    Dropped,
}

/// One request as the engine sees it.
#[derive(Debug)]
pub struct Job {
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub fault: Option<Fault>,
    events: mpsc::Sender<Event>,
}

impl Job {
    /// A job and the receiver its events arrive on. The channel has room for every event the
    /// job can produce (tokens plus one ending), so the engine never waits on a slow client and
    /// the memory is bounded by what the request asked for (the caller caps `max_tokens`).
    pub fn new(
        prompt_tokens: u32,
        max_tokens: u32,
        fault: Option<Fault>,
    ) -> (Job, mpsc::Receiver<Event>) {
        let max_tokens = max_tokens.max(1);
        let capacity = usize::try_from(max_tokens).unwrap_or(usize::MAX / 2) + 1;
        let (events, rx) = mpsc::channel(capacity);
        (
            Job {
                prompt_tokens,
                max_tokens,
                fault,
                events,
            },
            rx,
        )
    }

    /// Whether the client went away (its response, holding the receiver, was dropped).
    fn is_gone(&self) -> bool {
        self.events.is_closed()
    }
}

/// Starts the scheduler; jobs go into the returned sender (bounded by [`QUEUE_CAPACITY`]). The
/// task ends when every sender is dropped.
pub fn spawn(timing: Timing) -> (mpsc::Sender<Job>, JoinHandle<()>) {
    let (jobs, rx) = mpsc::channel(QUEUE_CAPACITY);
    (jobs, tokio::spawn(schedule(rx, timing)))
}

/// A request in the batch.
struct Running {
    job: Job,
    emitted: u32,
    fault_at: u32,
    stalled: bool,
    paused_until: Option<Instant>,
}

impl Running {
    fn new(job: Job) -> Running {
        Running {
            fault_at: job.max_tokens / 2,
            job,
            emitted: 0,
            stalled: false,
            paused_until: None,
        }
    }

    /// The end of one step for this request; returns whether it stays in the batch.
    fn advance(&mut self, now: Instant, timing: &Timing) -> bool {
        if let Some(until) = self.paused_until {
            if now < until {
                return !self.job.is_gone();
            }
            self.paused_until = None;
        }
        if self.emitted == self.fault_at {
            match self.job.fault {
                Some(Fault::MidstreamError) => {
                    let _ = self.job.events.try_send(Event::Failed);
                    return false;
                }
                Some(Fault::Drop) => {
                    let _ = self.job.events.try_send(Event::Dropped);
                    return false;
                }
                Some(Fault::Stall) if !self.stalled => {
                    self.stalled = true;
                    self.paused_until = Some(now + timing.stall);
                    return true;
                }
                _ => {}
            }
        }
        // A failed send means the client is gone (the channel cannot be full, see `Job::new`):
        // the request leaves the batch now, freeing its slot for the next step.
        if self
            .job
            .events
            .try_send(Event::Token(self.emitted))
            .is_err()
        {
            return false;
        }
        self.emitted += 1;
        if self.emitted >= self.job.max_tokens {
            let _ = self.job.events.try_send(Event::Done);
            return false;
        }
        true
    }
}

async fn schedule(mut jobs: mpsc::Receiver<Job>, timing: Timing) {
    let max_batch = timing.max_batch.max(1);
    let mut batch: Vec<Running> = Vec::with_capacity(max_batch);
    loop {
        batch.retain(|r| !r.job.is_gone());
        let mut prefill = Duration::ZERO;
        let mut admit = |job: Job, batch: &mut Vec<Running>| {
            if job.is_gone() {
                return;
            }
            prefill = prefill.saturating_add(timing.prefill(job.prompt_tokens));
            batch.push(Running::new(job));
        };
        if batch.is_empty() {
            // Idle: wait for work instead of stepping an empty batch.
            let Some(job) = jobs.recv().await else {
                return;
            };
            admit(job, &mut batch);
        }
        while batch.len() < max_batch {
            match jobs.try_recv() {
                Ok(job) => admit(job, &mut batch),
                Err(_) => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        tokio::time::sleep(prefill.saturating_add(timing.step(batch.len()))).await;
        let now = Instant::now();
        batch.retain_mut(|r| r.advance(now, &timing));
    }
}
