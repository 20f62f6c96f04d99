//! What every actor keeps to show itself in the live tree, written once: its node, the
//! throttle of its publications, and the heartbeat. An actor implements [`Observed`]
//! (where its frame is, how its snapshot is built) and gets `publish`,
//! `beat` and the marks of a change from it.

use std::sync::Arc;
use std::time::Duration;

use super::{NodeState, Registry, SnapshotThrottle};

/// An actor's place in the live tree.
#[derive(Debug)]
pub struct Frame {
    /// Its node in the registry.
    pub node_id: String,
    /// Where it publishes.
    registry: Arc<Registry>,
    throttle: SnapshotThrottle,
    /// A publication is armed for when the throttle lets it go (see
    /// [`Frame::arm_publication`]).
    armed: bool,
}

impl Frame {
    pub fn new(node_id: impl Into<String>, registry: Arc<Registry>, every: Duration) -> Self {
        Self {
            node_id: node_id.into(),
            registry,
            throttle: SnapshotThrottle::new(every),
            armed: false,
        }
    }

    /// Something shown changed: published when the throttle next lets it.
    pub fn changed(&mut self) {
        self.throttle.dirty = true;
    }

    /// A transition (connected, a probe answered, a flight ended): published at once.
    pub fn transition(&mut self) {
        self.throttle.transition();
    }

    /// Whether a publication for later must be armed now: something changed that was
    /// not published yet, and none is armed (so a burst followed by silence is still
    /// shown). The caller arms it (a message to itself after the interval) and calls
    /// [`Frame::armed_fired`] when it comes.
    pub fn arm_publication(&mut self) -> bool {
        let arm = self.throttle.dirty && !self.armed;
        self.armed |= arm;
        arm
    }

    /// The armed publication came.
    pub fn armed_fired(&mut self) {
        self.armed = false;
    }
}

/// An actor that shows itself in the live tree.
pub trait Observed {
    fn frame(&mut self) -> &mut Frame;
    /// Its snapshot, built only when a publication is due.
    fn snapshot(&self) -> NodeState;

    /// Publish when due (at once with `force`).
    fn publish(&mut self, force: bool) {
        if !self.frame().throttle.due(force) {
            return;
        }
        let snapshot = self.snapshot();
        let frame = self.frame();
        frame.registry.publish(&frame.node_id, snapshot);
    }

    /// The heartbeat: the node is alive, and its snapshot (ages, rates) is shown again.
    fn beat(&mut self) {
        let frame = self.frame();
        frame.registry.beat(&frame.node_id);
        frame.changed();
    }
}
