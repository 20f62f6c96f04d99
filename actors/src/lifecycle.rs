//! One `ractor::Actor` for every actor of the tree: each actor is its state, which
//! says how it is built, what it does once started, what it does with each message and
//! when a child of its ends ([`Behaviour`]); [`Lifecycle`] runs it. The five actors do
//! not each write ractor's lifecycle out again, and an actor's file reads as its
//! decisions.

use std::future::Future;
use std::marker::PhantomData;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, Message, SupervisionEvent};

use crate::restart::child_gone;

/// An actor's state, and the steps of its life. Every step runs in its mailbox.
pub trait Behaviour: Send + Sized + 'static {
    type Msg: Message;
    type Args: Send + 'static;

    /// Its state from its arguments; an error fails the spawn (the supervisor's
    /// respawn pacing counts it).
    fn build(args: Self::Args) -> Result<Self, ActorProcessingErr>;

    /// Once registered: timers armed, children spawned, the first snapshot published.
    fn started(&mut self, myself: &ActorRef<Self::Msg>) -> impl Future<Output = ()> + Send;

    /// One message, and what is published after it.
    fn receive(
        &mut self,
        myself: &ActorRef<Self::Msg>,
        msg: Self::Msg,
    ) -> impl Future<Output = ()> + Send;

    /// A linked child failed or stopped (`why`: its panic or its reason). Only the
    /// supervisors have children.
    fn child_gone(&mut self, myself: &ActorRef<Self::Msg>, id: ActorId, why: String) {
        let _ = (myself, id, why);
    }
}

/// The `ractor::Actor` that runs a [`Behaviour`] `B`.
pub struct Lifecycle<B>(PhantomData<fn() -> B>);

impl<B> Default for Lifecycle<B> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<B: Behaviour> Actor for Lifecycle<B> {
    type Msg = B::Msg;
    type State = B;
    type Arguments = B::Args;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        B::build(args)
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.started(&myself).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.receive(&myself, msg).await;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        evt: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some((id, why)) = child_gone(evt) {
            state.child_gone(&myself, id, why);
        }
        Ok(())
    }
}
