//! The edge's metrics: client connections, what the edge refused before any gate, and the
//! upgraded connections (tunnels) open.

use super::{registered, EdgeRefusal};
use prometheus::{IntCounter, IntGauge, Registry};

pub struct EdgeMetrics {
    /// `portcullis_edge_refusals_total`, one handle per reason (indexed by [`EdgeRefusal`]).
    refusals: [IntCounter; EdgeRefusal::ALL.len()],
    /// Client connections open on the proxy listeners.
    pub client_connections: IntGauge,
    /// Moved by the tunnel slots of `edge::tunnel::Tunnels` (owned by `state::Shared`).
    pub tunnels_open: IntGauge,
}

impl EdgeMetrics {
    /// Define the edge's series and register them in `registry`.
    pub fn register(registry: &Registry) -> Self {
        let tunnels_open = registered(
            registry,
            IntGauge::new(
                "portcullis_tunnels_open",
                "Upgraded connections (WebSocket etc.) currently open",
            ),
        );
        let vec = super::counter_vec(
            registry,
            "portcullis_edge_refusals_total",
            "Connections and requests the edge refused before any gate, by reason",
            &["reason"],
        );
        let refusals = EdgeRefusal::ALL.map(|r| vec.with_label_values(&[r.as_str()]));
        let client_connections = registered(
            registry,
            IntGauge::new(
                "portcullis_client_connections",
                "Client connections open on the proxy listeners",
            ),
        );
        Self {
            refusals,
            client_connections,
            tunnels_open,
        }
    }

    pub fn refusal(&self, r: EdgeRefusal) {
        self.refusals[r as usize].inc();
    }

    /// The counter itself, for a connection that counts on its own.
    pub fn refusal_counter(&self, r: EdgeRefusal) -> IntCounter {
        self.refusals[r as usize].clone()
    }
}
