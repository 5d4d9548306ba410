//! Streaming connections over HTTP, shared by the apiserver, the kubelet and the Ingress
//! controller (upstream's apimachinery `httpstream`): [`proxy`] forwards a request to the next hop — an upgrade
//! (SPDY or WebSocket, for exec, attach and port-forward), whose two connections are then
//! spliced, or a request with a streamed answer (container logs); [`websocket`] serves
//! WebSocket clients of a runtime that speaks only SPDY ([`spdy`]); [`params`] reads
//! and writes their query strings; [`serving`] gives up on connections that say
//! nothing.

pub mod params;
pub mod proxy;
pub mod serving;
pub mod spdy;
pub mod websocket;
