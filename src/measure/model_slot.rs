//! The request's `model`, as the request body names it: decided once, by the body scanner, while
//! the body streams upstream; route matching and the metric labels wait for it.

use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;

/// The request's `model`, decided by the request-body scanner as the body streams past:
/// found, or known to be absent. Route matching may wait for it.
#[derive(Default)]
pub(crate) struct ModelCell {
    value: OnceLock<Option<Arc<str>>>,
    decided: Notify,
}

impl ModelCell {
    /// Records the model (`None`: the body named none); only the first call counts.
    pub(crate) fn decide(&self, model: Option<&str>) {
        self.decide_shared(model.map(Into::into));
    }

    /// [`decide`](Self::decide), with the name already shared.
    pub(crate) fn decide_shared(&self, model: Option<Arc<str>>) {
        if self.value.set(model).is_ok() {
            self.decided.notify_waiters();
        }
    }

    /// The model, if the body named one and it has been read.
    pub(crate) fn get(&self) -> Option<&str> {
        self.value.get().and_then(|m| m.as_deref())
    }

    /// The model as a shared string, for the record.
    pub(crate) fn shared(&self) -> Option<Arc<str>> {
        self.value.get().and_then(Clone::clone)
    }

    pub(crate) fn is_decided(&self) -> bool {
        self.value.get().is_some()
    }

    /// Resolves once the model is decided.
    pub(crate) async fn decided(&self) {
        loop {
            let notified = self.decided.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_decided() {
                return;
            }
            notified.await;
        }
    }
}

pub(crate) type ModelSlot = Arc<ModelCell>;
