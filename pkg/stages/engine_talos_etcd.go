package stages

import (
	"context"
	"errors"
	"fmt"
)

// etcdGate is the check before a control plane is cordoned for its reboot:
// every etcd member healthy (see EtcdView.Judge) and quorum kept while this
// node is down, or the outage accepted by the operator. It pauses, naming the
// member and how to look at it, before anything changes on the node.
func (r *talosRun) etcdGate(ctx context.Context, n *osNode) error {
	stage, name := r.stage.Name(), n.Name

	r.e.node(stage, name, PhasePending, "checking etcd: every member's status and quorum without %s", name)

	verdict := ReadEtcd(ctx, r.e.Talos, r.etcdNodes).Judge(name)

	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("stage %s: node %q: etcd check: %w", stage, name, ctx.Err())
	case !verdict.Healthy():
		reason := fmt.Sprintf("etcd is not healthy: %s; %s is not rebooted while it is", verdict.Describe(), name)

		return r.e.pause(ctx, stage, name, "checks: "+reason, verdict.LookAction("resume (kubectl ichor resume)"),
			fmt.Errorf("node %q: %s", name, reason))
	case verdict.Outage() && !r.opts.AllowEtcdOutage:
		reason := verdict.OutageText(name)

		return r.e.pause(ctx, stage, name, "checks: "+reason, OutageAction, errors.New(reason))
	case verdict.Outage():
		r.e.node(stage, name, PhasePending, "%s: accepted (--allow-etcd-outage)", verdict.OutageText(name))
	default:
		r.e.node(stage, name, PhasePending, "etcd healthy: %d voter(s), %d left while %s reboots (quorum %d)",
			verdict.Voters, verdict.Left, name, verdict.Quorum)
	}

	return nil
}
