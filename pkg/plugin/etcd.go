package plugin

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// addEtcdFlags adds the etcd flag of the Talos commands and makes them read
// etcd for the plan's etcd check.
func addEtcdFlags(cmd *cobra.Command, o *planOptions) {
	o.readEtcd = true
	cmd.Flags().BoolVar(&o.AllowEtcdOutage, "allow-etcd-outage", false,
		"Accept that a control plane's reboot stops a one- or two-member etcd (and the Kubernetes API) until it is back")
}

// readEtcd reads etcd through the control planes' Talos APIs; nil when the
// Talos client cannot read etcd (the check then says so).
func readEtcd(ctx context.Context, talos discovery.TalosReader, snap *discovery.Snapshot) *stages.EtcdView {
	r, ok := capable[stages.EtcdReader](talos)
	if !ok {
		return nil
	}

	var nodes []stages.EtcdNode

	for _, n := range snap.Nodes {
		if n.ControlPlane {
			nodes = append(nodes, stages.EtcdNode{Name: n.Name, IP: n.InternalIP})
		}
	}

	return stages.ReadEtcd(ctx, r, nodes)
}
