//! Which route a request takes: the configured routes in order, the first match wins, and
//! everything else falls into `default`.
//!
//! A route may match on the request's `model`, which is only known once the body has streamed
//! past. So matching runs in two steps: at the request head every condition but the model is
//! checked once, leaving the routes still possible ([`Candidates`]); the route is decided as soon
//! as the first candidate needs no model, or the model is known.

use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method, Uri};
use wildmatch::WildMatch;

use crate::config::{HeaderMatch, Route, Slo, DEFAULT_ROUTE};
use crate::parse::Dialect;

/// What a request on a route is held to; shared by every request on it.
#[derive(Debug)]
pub(crate) struct RouteInfo {
    pub(crate) name: Arc<str>,
    pub(crate) slo: Option<Slo>,
    /// How responses on this route are read, when the config pins it.
    pub(crate) dialect: Option<Dialect>,
}

struct CompiledRoute {
    info: Arc<RouteInfo>,
    path: Option<String>,
    path_prefix: Option<String>,
    methods: Option<Vec<Method>>,
    headers: Vec<(HeaderName, HeaderMatch)>,
    model: Option<WildMatch>,
}

impl CompiledRoute {
    fn matches_head(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> bool {
        let path = uri.path();
        self.path.as_ref().is_none_or(|p| p == path)
            && self
                .path_prefix
                .as_ref()
                .is_none_or(|p| path.starts_with(p.as_str()))
            && self.methods.as_ref().is_none_or(|ms| ms.contains(method))
            && self.headers.iter().all(|(name, want)| match want {
                HeaderMatch::Present(_) => headers.contains_key(name),
                HeaderMatch::Exact(value) => headers
                    .get_all(name)
                    .iter()
                    .any(|v| v.as_bytes() == value.as_bytes()),
            })
    }
}

/// The compiled routes of one configuration.
pub(crate) struct Router {
    routes: Vec<CompiledRoute>,
    default: Arc<RouteInfo>,
}

/// The routes a request can still take after its head, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidates(Vec<u16>);

impl Router {
    /// Compiles routes that the configuration has already validated. A route named `default`
    /// carries no match and configures the fallback instead.
    pub(crate) fn new(routes: &[Route]) -> Router {
        let mut default = Arc::new(RouteInfo {
            name: Arc::from(DEFAULT_ROUTE),
            slo: None,
            dialect: None,
        });
        let mut compiled = Vec::new();
        for route in routes {
            let info = Arc::new(RouteInfo {
                name: Arc::from(route.name.as_str()),
                slo: route.slo,
                dialect: route.dialect,
            });
            if route.name == DEFAULT_ROUTE {
                default = info;
                continue;
            }
            let m = &route.matcher;
            compiled.push(CompiledRoute {
                info,
                path: m.path.clone(),
                path_prefix: m.path_prefix.clone(),
                methods: m.methods.as_ref().map(|ms| {
                    ms.iter()
                        .filter_map(|s| Method::from_bytes(s.to_ascii_uppercase().as_bytes()).ok())
                        .collect()
                }),
                headers: m
                    .headers
                    .iter()
                    .flatten()
                    .filter_map(|(k, v)| {
                        Some((HeaderName::from_bytes(k.as_bytes()).ok()?, v.clone()))
                    })
                    .collect(),
                model: m.model.as_deref().map(WildMatch::new),
            });
        }
        Router {
            routes: compiled,
            default,
        }
    }

    /// Every route name, the default included, for metrics that list routes up front.
    pub(crate) fn routes(&self) -> impl Iterator<Item = &Arc<RouteInfo>> {
        self.routes
            .iter()
            .map(|r| &r.info)
            .chain(std::iter::once(&self.default))
    }

    /// Checks every condition but the model, once per request.
    pub(crate) fn candidates(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Candidates {
        Candidates(
            self.routes
                .iter()
                .enumerate()
                .filter(|(_, r)| r.matches_head(method, uri, headers))
                .map(|(i, _)| i as u16)
                .collect(),
        )
    }

    /// The route, if the head alone decides it: the first candidate needs no model.
    pub(crate) fn decided(&self, candidates: &Candidates) -> Option<Arc<RouteInfo>> {
        match candidates.0.first() {
            None => Some(self.default.clone()),
            Some(&i) => {
                let route = &self.routes[usize::from(i)];
                route.model.is_none().then(|| route.info.clone())
            }
        }
    }

    /// The route once the model is known (`None`: the body named no model, so no model
    /// condition holds).
    pub(crate) fn with_model(
        &self,
        candidates: &Candidates,
        model: Option<&str>,
    ) -> Arc<RouteInfo> {
        candidates
            .0
            .iter()
            .map(|&i| &self.routes[usize::from(i)])
            .find(|r| match (&r.model, model) {
                (None, _) => true,
                (Some(glob), Some(model)) => glob.matches(model),
                (Some(_), None) => false,
            })
            .map_or_else(|| self.default.clone(), |r| r.info.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn router(yaml: &str) -> Router {
        Router::new(&Config::parse(yaml, "t.yaml").unwrap().routes)
    }

    fn route(
        r: &Router,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        model: Option<&str>,
    ) -> String {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let c = r.candidates(&method.parse().unwrap(), &path.parse().unwrap(), &h);
        let decided = r.decided(&c);
        let full = r.with_model(&c, model);
        if let Some(d) = &decided {
            assert_eq!(
                d.name, full.name,
                "deciding early must agree with deciding late"
            );
        }
        full.name.to_string()
    }

    #[test]
    fn first_match_wins_and_the_rest_fall_into_default() {
        let r = router(
            r#"
routes:
  - name: gold
    match: {path_prefix: /v1/, headers: {x-tier: gold}}
  - name: llama
    match: {path_prefix: /v1/chat/, model: "llama-*"}
  - name: chat
    match: {path: /v1/chat/completions, methods: [POST]}
  - name: debug
    match: {headers: {x-debug: true}}
"#,
        );
        assert_eq!(
            route(
                &r,
                "POST",
                "/v1/chat/completions",
                &[("x-tier", "gold")],
                Some("llama-3")
            ),
            "gold"
        );
        assert_eq!(
            route(
                &r,
                "POST",
                "/v1/chat/completions",
                &[("x-tier", "silver")],
                Some("llama-3")
            ),
            "llama"
        );
        assert_eq!(
            route(&r, "POST", "/v1/chat/completions", &[], Some("gpt-4o")),
            "chat"
        );
        assert_eq!(route(&r, "POST", "/v1/chat/completions", &[], None), "chat");
        assert_eq!(
            route(&r, "GET", "/v1/chat/completions", &[], None),
            "default"
        );
        assert_eq!(
            route(&r, "GET", "/v1/chat/completions?x=1", &[], Some("llama-2")),
            "llama"
        );
        assert_eq!(
            route(&r, "GET", "/health", &[("x-debug", "")], None),
            "debug"
        );
        assert_eq!(route(&r, "GET", "/health", &[], None), "default");
    }

    #[test]
    fn a_model_condition_waits_for_the_model_and_others_do_not() {
        let r =
            router("routes:\n  - name: llama\n    match: {model: \"llama-?\"}\n  - name: all\n");
        let c = r.candidates(&Method::POST, &"/x".parse().unwrap(), &HeaderMap::new());
        assert!(r.decided(&c).is_none());
        assert_eq!(&*r.with_model(&c, Some("llama-3")).name, "llama");
        assert_eq!(&*r.with_model(&c, Some("llama-30")).name, "all");
        let r = router("routes:\n  - name: chat\n    match: {path_prefix: /v1/}\n  - name: llama\n    match: {model: \"l*\"}\n");
        let c = r.candidates(&Method::POST, &"/v1/x".parse().unwrap(), &HeaderMap::new());
        assert_eq!(&*r.decided(&c).unwrap().name, "chat");
    }

    #[test]
    fn a_route_named_default_configures_the_fallback() {
        let r = router("routes:\n  - name: chat\n    match: {path: /c}\n  - name: default\n    slo: {ttft: 1s}\n");
        let c = r.candidates(&Method::GET, &"/other".parse().unwrap(), &HeaderMap::new());
        let d = r.decided(&c).unwrap();
        assert_eq!(&*d.name, "default");
        assert_eq!(d.slo.unwrap().ttft, Some(std::time::Duration::from_secs(1)));
        assert_eq!(r.routes().count(), 2);
    }
}
