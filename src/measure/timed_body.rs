//! The response body as the client receives it, timestamped frame by frame.
//!
//! [`TimedBody`] forwards every frame of the upstream body unchanged, in the same poll, and shows
//! its data to the request's [`Recorder`] stamped with the moment it is handed to the server,
//! which writes it to the client connection at once. It forwards `is_end_stream` and `size_hint`, and
//! finishes the recorder exactly once: at the end, on an upstream error, or (through the
//! recorder's `Drop`) when the client goes away and hyper drops the body.
//!
//! A server that says when what it was handed has been written (the proxy's own HTTP/1.1
//! server, through [`TimedBody::written`]) lets a body made [`TimedBody::read_after_writes`] read
//! a frame then, after the write: the frame is still stamped when it is handed on, but its
//! parsing and accounting are off the path from the upstream's socket to the client's, where
//! they would add to every token's latency and most to the first's. Such a server also hands the
//! response's head back once it has encoded it ([`TimedBody::hand_head`]), and the head's fields
//! are read with the first frames, after their write.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use super::recorder::Recorder;
use crate::policy::outcome::End;

pin_project! {
    /// A response body that times what it hands on.
    pub struct TimedBody<B> {
        #[pin]
        inner: B,
        recorder: Recorder,
        // The longest the upstream may send nothing; `None`: no limit.
        idle: Option<Duration>,
        // When the last frame arrived (or the body started).
        last: Instant,
        // Armed on the first wait, moved only when it fires early. In the body itself, not
        // boxed: checked on every wait, one heap object fewer to reach.
        #[pin]
        timer: Option<Sleep>,
        // Whether frames are read after they are written ([`TimedBody::read_after_writes`]).
        defer: bool,
        // Frames handed on and not read yet.
        unread: Unread,
    }
    impl<B> PinnedDrop for TimedBody<B> {
        // A frame handed on counts even when the client goes away before it was read.
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            this.unread.read(this.recorder);
        }
    }
}

/// Frames a body may hold unread: those handed on in one go (a read of the upstream that held
/// several events) are read together after their write.
const UNREAD: usize = 4;

/// Frames handed on and not read yet, oldest first, each with the moment it was handed on, and
/// the response head's fields when they are read with them.
#[derive(Default)]
struct Unread {
    frames: [Option<(Bytes, Instant)>; UNREAD],
    len: usize,
    head: Head,
}

/// Where the response head's fields are, for the recorder.
#[derive(Default)]
enum Head {
    /// Read (or never to be read: the head was not handed over).
    #[default]
    Read,
    /// To be handed over by the server ([`TimedBody::hand_head`]).
    Awaited,
    /// Handed over, to be read before the first frame.
    Held(http::response::Parts),
}

impl Unread {
    /// Keeps a frame for later; when full, the ones kept are read first.
    fn keep(&mut self, data: Bytes, at: Instant, recorder: &mut Recorder) {
        if self.len == UNREAD {
            self.read(recorder);
        }
        self.frames[self.len] = Some((data, at));
        self.len += 1;
    }

    /// Reads the head if it is held, then the frames kept, in order, each at the moment it was
    /// handed on.
    fn read(&mut self, recorder: &mut Recorder) {
        if let Head::Held(_) = self.head {
            if let Head::Held(head) = std::mem::take(&mut self.head) {
                recorder.on_head(head.status, &head.headers);
            }
        }
        for slot in &mut self.frames[..self.len] {
            if let Some((data, at)) = slot.take() {
                recorder.on_data(&data, at);
            }
        }
        self.len = 0;
    }

    /// Ends the request: what was handed on is read first, so it all counts.
    fn finish(&mut self, recorder: &mut Recorder, end: End, now: Instant) {
        self.read(recorder);
        recorder.finish(end, now);
    }
}

impl<B> TimedBody<B> {
    /// Everything handed on so far has been written to the client: the frames kept unread (and
    /// the head, when it was handed over) are read now.
    pub fn written(self: Pin<&mut Self>) {
        let this = self.project();
        this.unread.read(this.recorder);
    }

    /// The response's head, handed over by a server once it has encoded it: read with the
    /// first frames, after their write, by a body made [`TimedBody::read_after_writes`].
    pub fn hand_head(self: Pin<&mut Self>, parts: http::response::Parts) {
        let this = self.project();
        if let Head::Awaited = this.unread.head {
            this.unread.head = Head::Held(parts);
        }
    }

    /// The upstream body it times.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The upstream body it times, pinned.
    pub fn inner_pin_mut(self: Pin<&mut Self>) -> Pin<&mut B> {
        self.project().inner
    }
}

/// Why a timed body ended in an error.
#[derive(Debug)]
pub enum TimedBodyError<E> {
    /// The upstream body failed.
    Upstream(E),
    /// The upstream sent nothing for this long.
    Idle(Duration),
}

impl<E: std::fmt::Display> std::fmt::Display for TimedBodyError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimedBodyError::Upstream(e) => write!(f, "the upstream response failed: {e}"),
            TimedBodyError::Idle(after) => write!(
                f,
                "the upstream sent nothing for {}",
                humantime::format_duration(*after)
            ),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for TimedBodyError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TimedBodyError::Upstream(e) => Some(e),
            TimedBodyError::Idle(_) => None,
        }
    }
}

impl<B: Body<Data = Bytes>> TimedBody<B> {
    /// Wraps a response body; an empty one (HEAD, 204, 304) finishes the request at once,
    /// because hyper may never poll it. `idle` ends a body whose upstream sends nothing for that
    /// long, as an error (`timeouts.idle`).
    pub fn new(inner: B, mut recorder: Recorder, idle: Option<Duration>) -> Self {
        let now = Instant::now();
        if inner.is_end_stream() {
            recorder.finish(End::Complete, now);
        }
        TimedBody {
            inner,
            recorder,
            idle,
            last: now,
            timer: None,
            defer: false,
            unread: Unread::default(),
        }
    }

    /// [`TimedBody::new`] for a server that says when what it was handed has been written
    /// ([`TimedBody::written`]) and hands the encoded head over ([`TimedBody::hand_head`]), with a
    /// recorder told only the response's status ([`Recorder::on_status`]): each frame is stamped
    /// when it is handed on and read after its write, and the head's fields (the engine's
    /// timings, the content type, the dialect) with the first frames, so that neither is on the
    /// way to the client's first token. A body that has already ended is finished at once, so
    /// its head is read by the caller, as for `new`.
    pub fn read_after_writes(inner: B, recorder: Recorder, idle: Option<Duration>) -> Self {
        let mut body = TimedBody::new(inner, recorder, idle);
        body.defer = true;
        body.unread.head = Head::Awaited;
        body
    }
}

impl<B: Body<Data = Bytes>> Body for TimedBody<B> {
    type Data = Bytes;
    type Error = TimedBodyError<B::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        // Timestamp only frames that are ready, never on Pending.
        let polled = match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(polled) => polled,
            Poll::Pending => {
                let Some(idle) = *this.idle else {
                    return Poll::Pending;
                };
                // One timer per body, reset only when it fires before the idle time has passed
                // since the last frame: frames themselves never touch it. A timer that has been
                // polled keeps this task's waker until it fires, so until then it is not polled
                // again (each poll re-registers the waker: a cost on every frame's wake-up).
                if this
                    .timer
                    .as_ref()
                    .get_ref()
                    .as_ref()
                    .is_some_and(|t| !t.is_elapsed())
                {
                    return Poll::Pending;
                }
                loop {
                    let deadline = *this.last + idle;
                    if this.timer.is_none() {
                        this.timer.set(Some(tokio::time::sleep_until(deadline)));
                    }
                    let mut timer = this.timer.as_mut().as_pin_mut().expect("armed above");
                    ready!(timer.as_mut().poll(cx));
                    if Instant::now() >= deadline {
                        break;
                    }
                    timer.reset(deadline);
                }
                this.unread
                    .finish(this.recorder, End::UpstreamIdle, Instant::now());
                return Poll::Ready(Some(Err(TimedBodyError::Idle(idle))));
            }
        };
        let now = Instant::now();
        *this.last = now;
        match &polled {
            Some(Ok(frame)) => {
                // hyper stops polling once the body says it has ended, so finish now; trailers
                // are the end of a body too.
                let end = frame.is_trailers() || this.inner.is_end_stream();
                match frame.data_ref() {
                    // Read once written (the last frame at once: the request ends with it).
                    Some(data) if *this.defer && !end => {
                        this.unread.keep(data.clone(), now, this.recorder);
                    }
                    Some(data) => {
                        this.unread.read(this.recorder);
                        this.recorder.on_data(data, now);
                    }
                    None => {}
                }
                if end {
                    this.unread.finish(this.recorder, End::Complete, now);
                }
            }
            Some(Err(_)) => this.unread.finish(this.recorder, End::UpstreamBroken, now),
            None => this.unread.finish(this.recorder, End::Complete, now),
        }
        Poll::Ready(polled.map(|r| r.map_err(TimedBodyError::Upstream)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    //! Exact timing on paused time: the body yields frames after known delays, and the record
    //! must show exactly those delays.

    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Duration;

    use http_body_util::BodyExt;

    use super::*;
    use crate::measure::Meter;
    use crate::publish::record::{Record, RecordSink};

    fn chunk(content: &str) -> Bytes {
        Bytes::from(format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}}}}]}}\n\n"
        ))
    }

    /// Plays `(delay, bytes)` steps through a TimedBody on paused time and returns the record.
    async fn play(steps: Vec<(u64, Bytes)>, drop_after: Option<usize>) -> (Record, Arc<Meter>) {
        play_as(steps, drop_after, None, None).await
    }

    /// [`play`], with an idle limit, and with `written_after`: the body reads each frame once
    /// told it was written ([`TimedBody::written`]), which is that many milliseconds after it was handed
    /// on (never for the frame the body is dropped after; with [`NEVER`], never at all: each
    /// frame is read when the next one comes, or at the end).
    async fn play_as(
        steps: Vec<(u64, Bytes)>,
        drop_after: Option<usize>,
        idle: Option<Duration>,
        written_after: Option<u64>,
    ) -> (Record, Arc<Meter>) {
        play_with(steps, drop_after, idle, written_after, false).await
    }

    /// [`play_as`], and with `head_back` the recorder is told the status only and the head is
    /// handed over as the proxy's server does ([`TimedBody::read_after_writes`],
    /// [`TimedBody::hand_head`]).
    async fn play_with(
        steps: Vec<(u64, Bytes)>,
        drop_after: Option<usize>,
        idle: Option<Duration>,
        written_after: Option<u64>,
        head_back: bool,
    ) -> (Record, Arc<Meter>) {
        let (mut recorder, meter, records) = recording();
        recorder.model_slot().decide(Some("m"));
        let mut head = http::Response::new(()).into_parts().0;
        head.headers
            .insert("content-type", "text/event-stream".parse().unwrap());
        let scripted = ScriptedBody {
            steps: steps.into(),
            sleep: None,
            due: Instant::now(),
        };
        let mut body = if head_back {
            recorder.on_status(http::StatusCode::OK);
            let mut body = Box::pin(TimedBody::read_after_writes(scripted, recorder, idle));
            body.as_mut().hand_head(head);
            body
        } else {
            recorder.on_head(http::StatusCode::OK, &head.headers);
            let mut body = TimedBody::new(scripted, recorder, idle);
            // Read after writes, the head read before: as a server that is told nothing of it.
            body.defer = written_after.is_some();
            Box::pin(body)
        };
        let mut n = 0;
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
            n += 1;
            if Some(n) == drop_after {
                break;
            }
            if let Some(after) = written_after {
                let unread = body.as_mut().frame_is_unread();
                assert!(
                    unread || body.is_end_stream(),
                    "frame {n} was read before its write"
                );
                if head_back && n == 1 {
                    assert!(
                        matches!(body.unread.head, Head::Held(_)),
                        "the head was read before the first write"
                    );
                }
                if after != NEVER {
                    tokio::time::sleep(Duration::from_millis(after)).await;
                    body.as_mut().written();
                    assert!(!body.as_mut().frame_is_unread());
                }
            }
        }
        drop(body);
        let record = records
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("one record");
        (record, meter)
    }

    const NEVER: u64 = u64::MAX;

    /// A recorder for a chat request on a meter of its own, and where its record arrives.
    fn recording() -> (Recorder, Arc<Meter>, std::sync::mpsc::Receiver<Record>) {
        let mut meter = Meter::detached(1 << 20);
        let (sink, records) = RecordSink::channel(8, meter.metrics.access_log_dropped.clone());
        meter.access_log = Some(sink);
        let meter = Arc::new(meter);
        let uri: http::Uri = "/v1/chat/completions".parse().unwrap();
        let recorder = Recorder::start(
            meter.clone(),
            &http::Method::POST,
            &uri,
            &http::HeaderMap::new(),
        );
        (recorder, meter, records)
    }

    impl<B> TimedBody<B> {
        fn frame_is_unread(self: Pin<&mut Self>) -> bool {
            self.unread.len > 0
        }
    }

    /// A body that yields each frame its delay after the one before was due, on tokio's
    /// (paused) clock, however late it is polled.
    struct ScriptedBody {
        steps: VecDeque<(u64, Bytes)>,
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
        due: Instant,
    }

    impl Body for ScriptedBody {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            let this = &mut *self;
            let Some(&(delay, _)) = this.steps.front() else {
                return Poll::Ready(None);
            };
            let due = this.due + Duration::from_millis(delay);
            let sleep = this
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            ready!(sleep.as_mut().poll(cx));
            this.sleep = None;
            this.due = due;
            Poll::Ready(
                this.steps
                    .pop_front()
                    .map(|(_, bytes)| Ok(Frame::data(bytes))),
            )
        }
    }

    /// A chat stream: role, five tokens (two in one frame), finish, done.
    fn story() -> Vec<(u64, Bytes)> {
        let role = Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        );
        let finish = Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        );
        vec![
            (10, role),
            (190, chunk("a")),
            (50, chunk("b")),
            (150, chunk("c")),
            // Two events in one frame arrive together: one gap of 40 ms, one of zero.
            (40, Bytes::from([chunk("d"), chunk("e")].concat())),
            (5, finish),
            (0, Bytes::from_static(b"data: [DONE]\n\n")),
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn figures_are_exact_on_paused_time() {
        let (r, meter) = play(story(), None).await;
        check_story(&r, &meter);
    }

    /// Read after its write, or only when the next frame comes, each frame still counts at the
    /// moment it was handed on: the same figures.
    #[tokio::test(start_paused = true)]
    async fn frames_read_after_their_write_count_when_they_were_handed_on() {
        let (r, meter) = play_as(story(), None, None, Some(0)).await;
        check_story(&r, &meter);
        let (r, meter) = play_as(story(), None, None, Some(NEVER)).await;
        check_story(&r, &meter);
    }

    fn check_story(r: &Record, meter: &Meter) {
        assert_eq!(r.outcome, "ok");
        assert_eq!(r.ttfb_ms, Some(10.0));
        assert_eq!(r.ttft_ms, Some(200.0));
        assert_eq!(r.ttfc_ms, Some(200.0));
        assert_eq!(r.output_tokens, 5);
        assert_eq!(r.token_source, "events");
        // (440 - 200) / (5 - 1)
        assert_eq!(r.tpot_ms, Some(60.0));
        assert_eq!(r.max_itl_ms, Some(150.0));
        assert_eq!(r.e2e_ms, 445.0);
        assert_eq!(r.finish_reason, Some("stop"));
        let text = String::from_utf8(meter.metrics.render()).unwrap();
        // Gaps: 50, 150, 40, 0.
        for line in [
            "tokenmeter_inter_token_latency_seconds_count{model=\"m\",route=\"default\"} 4",
            "tokenmeter_inter_token_latency_seconds_bucket{model=\"m\",route=\"default\",le=\"0.001\"} 1",
            "tokenmeter_inter_token_latency_seconds_bucket{model=\"m\",route=\"default\",le=\"0.05\"} 3",
            "tokenmeter_inter_token_latency_seconds_bucket{model=\"m\",route=\"default\",le=\"0.15\"} 4",
            "tokenmeter_time_to_first_token_seconds_bucket{model=\"m\",route=\"default\",le=\"0.2\"} 1",
            "tokenmeter_time_to_first_token_seconds_bucket{model=\"m\",route=\"default\",le=\"0.15\"} 0",
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
    }

    /// A frame handed on and not read yet when the client goes away, or when the upstream then
    /// falls silent, still counts.
    #[tokio::test(start_paused = true)]
    async fn a_frame_not_read_yet_counts_at_the_end() {
        let steps = || vec![(100, chunk("a")), (100, chunk("b")), (1000, chunk("c"))];
        let (r, _) = play_as(steps(), Some(2), None, Some(1)).await;
        assert_eq!(r.outcome, "cancelled");
        assert_eq!(r.output_tokens, 2);
        assert_eq!(r.max_itl_ms, Some(100.0));
        let (r, _) = play_as(steps(), None, Some(Duration::from_millis(500)), Some(NEVER)).await;
        assert_eq!(r.outcome, "error");
        assert_eq!(r.output_tokens, 2);
        assert_eq!(r.max_itl_ms, Some(100.0));
    }

    /// The head's fields read after the first write (the proxy's own server) give the same
    /// figures as read before it; and a head handed over is read even when the client goes
    /// before the first write, or nothing was ever written.
    #[tokio::test(start_paused = true)]
    async fn a_head_read_after_the_first_write_counts_the_same() {
        let (r, meter) = play_with(story(), None, None, Some(0), true).await;
        check_story(&r, &meter);
        let (r, meter) = play_with(story(), None, None, Some(NEVER), true).await;
        check_story(&r, &meter);
        let steps = || vec![(100, chunk("a")), (100, chunk("b")), (1000, chunk("c"))];
        let (r, _) = play_with(steps(), Some(1), None, Some(1), true).await;
        assert_eq!(r.outcome, "cancelled");
        assert_eq!(r.status, Some(200));
        assert_eq!(r.token_source, "events", "the head's content type was read");
        assert_eq!(r.output_tokens, 1);
    }

    /// A head awaited but never handed over leaves the request its status.
    #[tokio::test(start_paused = true)]
    async fn a_head_never_handed_over_leaves_the_status() {
        let (mut recorder, _meter, records) = recording();
        recorder.on_status(http::StatusCode::SERVICE_UNAVAILABLE);
        let scripted = ScriptedBody {
            steps: vec![(10, chunk("a"))].into(),
            sleep: None,
            due: Instant::now(),
        };
        drop(Box::pin(TimedBody::read_after_writes(
            scripted, recorder, None,
        )));
        let record = records
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("one record");
        assert_eq!(record.status, Some(503));
        assert_eq!(record.outcome, "cancelled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_dropped_midway_is_cancelled_once() {
        let (r, meter) = play(
            vec![(100, chunk("a")), (100, chunk("b")), (1000, chunk("c"))],
            Some(2),
        )
        .await;
        assert_eq!(r.outcome, "cancelled");
        assert_eq!(r.ttft_ms, Some(100.0));
        assert_eq!(r.e2e_ms, 200.0);
        let text = String::from_utf8(meter.metrics.render()).unwrap();
        assert!(text.contains(
            "tokenmeter_requests_total{model=\"m\",outcome=\"cancelled\",route=\"default\"} 1"
        ));
        assert!(text.contains("tokenmeter_in_flight_requests{route=\"default\"} 0"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_without_its_end_marker_is_an_error() {
        let (r, _) = play(vec![(100, chunk("a")), (100, chunk("b"))], None).await;
        assert_eq!(r.outcome, "error");
        assert_eq!(r.output_tokens, 2);
        assert_eq!(r.tpot_ms, Some(100.0));
    }
}
