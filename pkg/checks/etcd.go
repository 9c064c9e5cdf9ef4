package checks

import (
	"context"
	"fmt"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// EtcdQuorum is the engine's etcd gate, shown before the upgrade: every etcd member
// healthy through Talos (status answered, no error or alarm, not a learner, in step
// with the leader), and quorum kept while each control plane to upgrade reboots. A one-
// or two-member etcd is refused unless --allow-etcd-outage accepts the outage.
type EtcdQuorum struct{}

// Name implements Check.
func (EtcdQuorum) Name() string { return "etcd quorum" }

// Run implements Check.
func (EtcdQuorum) Run(_ context.Context, in *Input) api.Check {
	var rebooting []string

	for _, n := range active(in.Snapshot) {
		if n.ControlPlane && (n.Talos == nil || n.Talos.Version != in.Target.String()) {
			rebooting = append(rebooting, n.Name)
		}
	}

	if len(rebooting) == 0 {
		return ok("no control plane to reboot")
	}

	if in.Etcd == nil {
		return warn("etcd was not read through Talos", "look at it before the upgrade: talosctl -n <control plane> etcd status")
	}

	health := in.Etcd.Judge("")
	if !health.Healthy() {
		return refused("etcd is not healthy: "+health.Describe(), health.LookAction("plan again"))
	}

	for _, node := range rebooting {
		v := in.Etcd.Judge(node)
		if !v.Outage() {
			continue
		}

		if in.AllowEtcdOutage {
			return warn(v.OutageText(node)+": accepted (--allow-etcd-outage)", "")
		}

		return refused(v.OutageText(node), "run 3 or more control planes to keep quorum through each reboot, or accept the outage with --allow-etcd-outage")
	}

	v := in.Etcd.Judge(rebooting[0])

	return ok(fmt.Sprintf("%d voter(s) healthy; quorum %d kept while each of %s reboots", health.Voters, v.Quorum, text.SummarizeList(rebooting)))
}
