// Package talos is the only place kubectl-ichor talks to the Talos API. It is
// a thin wrapper over the machinery client
// (github.com/siderolabs/talos/pkg/machinery/client) that
//
//   - finds and opens a talosconfig the way talosctl does ($TALOSCONFIG,
//     ~/.talos/config, then the in-cluster /var/run/secrets/talos.dev/config),
//     with errors that say which flag to pass;
//   - offers one method per call the product makes, each addressed to one
//     node (its address as Talos routes it: the Kubernetes Node's InternalIP),
//     each error a *NodeError that names the node and the call;
//   - classifies errors a caller must treat differently: a node that cannot
//     be reached (rebooting), a call the node does not implement (an older
//     Talos), and credentials that lack the role.
//
// Methods set no deadlines of their own: a caller bounds every call with its
// context, and gives a control-plane apply and an upgrade their own, longer
// deadlines (an apply blocks while Talos restarts the static pods).
package talos
