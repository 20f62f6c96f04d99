//! A router that keeps the path of every route it is given, so that a test can hold a
//! listener's OpenAPI document against what the listener really routes.

use axum::routing::MethodRouter;
use axum::Router;

/// An axum [`Router`] and the paths routed in it. Build a listener's routes with it
/// instead of `Router::route`, and a route cannot be added without the test of the
/// document seeing it.
pub struct Routes<S = ()> {
    router: Router<S>,
    paths: Vec<&'static str>,
}

impl<S: Clone + Send + Sync + 'static> Default for Routes<S> {
    fn default() -> Self {
        Self {
            router: Router::new(),
            paths: Vec::new(),
        }
    }
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn route(mut self, path: &'static str, method_router: MethodRouter<S>) -> Self {
        self.router = self.router.route(path, method_router);
        self.paths.push(path);
        self
    }

    pub fn merge(mut self, other: Routes<S>) -> Self {
        self.router = self.router.merge(other.router);
        self.paths.extend(other.paths);
        self
    }

    /// Changes the router without adding a path: a layer, the state.
    pub fn map<S2>(self, f: impl FnOnce(Router<S>) -> Router<S2>) -> Routes<S2> {
        Routes {
            router: f(self.router),
            paths: self.paths,
        }
    }

    pub fn paths(&self) -> &[&'static str] {
        &self.paths
    }

    pub fn into_router(self) -> Router<S> {
        self.router
    }
}
