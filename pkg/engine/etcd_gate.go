package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// etcdGate is the check before a control plane is cordoned for its reboot:
// every etcd member healthy (see EtcdView.Judge) and quorum kept while this
// node is down, or the outage accepted by the operator. It pauses, naming the
// member and how to look at it, before anything changes on the node.
func (r *talosRun) etcdGate(ctx context.Context, n *osNode) error {
	stage, name := r.stage.Name(), n.Name

	r.e.node(stage, name, PhasePending, "checking etcd: every member's status and quorum without %s", name)

	// Nothing is changed on the node yet, and the gates right before its
	// install and its reboot read etcd again: a view of the last second does.
	verdict := r.lookEtcd(ctx).Judge(name)

	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("stage %s: node %q: etcd check: %w", stage, name, ctx.Err())
	case !verdict.Healthy():
		reason := fmt.Sprintf("etcd is not healthy: %s; %s is not rebooted while it is%s", verdict.Describe(), name, r.stillCordoned(name))

		return r.e.pause(ctx, stage, name, "checks: "+reason, verdict.LookAction("resume (kubectl ichor resume)"),
			fmt.Errorf("node %q: %s", name, reason))
	case verdict.Outage() && !r.opts.AllowEtcdOutage:
		reason := verdict.OutageText(name) + r.stillCordoned(name)

		return r.e.pause(ctx, stage, name, "checks: "+reason, stages.OutageAction, errors.New(reason))
	case verdict.Outage():
		r.e.node(stage, name, PhasePending, "%s: accepted (--allow-etcd-outage)", verdict.OutageText(name))
	default:
		r.e.node(stage, name, PhasePending, "etcd healthy: %d voter(s), %d left while %s reboots (quorum %d)",
			verdict.Voters, verdict.Left, name, verdict.Quorum)
	}

	return nil
}

// untouched ends the reason of a refusal before a node's cordon: nothing
// was changed on it, or (a resumed run) it stays cordoned from before.
func (r *talosRun) untouched(name string) string {
	if note := r.stillCordoned(name); note != "" {
		return note
	}

	return "; nothing was changed on it"
}

// stillCordoned says, for a refusal before a node's cordon, that an earlier
// run left it cordoned; "" when it is not.
func (r *talosRun) stillCordoned(name string) string {
	if node, ok := r.cache.Node(name); ok && kube.CordonedByIchor(node) {
		return fmt.Sprintf("; %s stays cordoned from an earlier run (kubectl ichor abort uncordons it)", name)
	}

	return ""
}

// readEtcd reads etcd through the control planes, judged on two passes at
// least EtcdProgressGap apart; a read soon after others takes one of their
// passes, a gap to two gaps old, as its first (see stages.EtcdChain).
func (r *talosRun) readEtcd(ctx context.Context) *stages.EtcdView {
	return r.etcd.Read(ctx)
}

// lookEtcd is readEtcd for a look that changes nothing by itself: the last
// view when its last pass is under a gap old (stages.EtcdChain.Recent).
func (r *talosRun) lookEtcd(ctx context.Context) *stages.EtcdView {
	return r.etcd.Recent(ctx)
}

// The moments a node is gated at again (gateBefore): the cordon's gate is
// minutes old by then (the drain takes up to DrainTimeout, the install up
// to UpgradeTimeout), and a resumed run reaches them hours later.
type gateMoment int

const (
	momentInstall gateMoment = iota // right before an Install call (MachineService.Upgrade reboots too)
	momentReboot                    // right before a Reboot call
)

// gateBefore gates a node right before its Install or Reboot call, the
// node cordoned and drained: no machine config change staged for the next
// boot (a reboot would activate it) and, on a control plane, every other
// etcd member healthy with quorum kept while this one is down (its own
// member may already be stopping: the reboot stops it anyway). A refusal
// pauses, the node staying cordoned with whatever it has installed.
func (r *talosRun) gateBefore(ctx context.Context, n *osNode, moment gateMoment) error {
	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP

	what, kept := "its install", "nothing installed yet"
	if moment == momentReboot {
		what, kept = "its reboot", r.installKept()
	}

	if err := r.stagedGate(ctx, n, fmt.Sprintf("; %s is not made: the node stays cordoned, %s", what, kept)); err != nil {
		return err
	}

	if !n.ControlPlane {
		return nil
	}

	verdict := r.readEtcd(ctx).Judge(name)
	others := verdict.UnhealthyOther(name)

	next := "resume (kubectl ichor resume) to go on with " + what
	if moment == momentReboot {
		next += fmt.Sprintf("; kubectl ichor abort uncordons the node but keeps the install, which its next reboot boots "+
			"(talosctl -n %s rollback drops it, rebooting into the running version, once etcd is healthy)", ip)
	}

	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("stage %s: node %q: etcd check before %s: %w", stage, name, what, ctx.Err())
	case len(others.Members) > 0 || len(others.Problems) > 0:
		reason := fmt.Sprintf("etcd is not healthy right before %s: %s; %s is not rebooted while it is: the node stays cordoned, %s",
			what, others.Describe(), name, kept)

		return r.e.pause(ctx, stage, name, reason, others.LookAction(next), fmt.Errorf("node %q: %s", name, reason))
	case verdict.Outage() && !r.opts.AllowEtcdOutage:
		reason := verdict.OutageText(name) + fmt.Sprintf(" (right before %s; the node stays cordoned, %s)", what, kept)

		return r.e.pause(ctx, stage, name, reason, stages.OutageAction, errors.New(reason))
	}

	r.e.node(stage, name, PhaseUpgrading, "etcd healthy right before %s: %d voter(s), %d left while %s reboots (quorum %d)",
		what, verdict.Voters, verdict.Left, name, verdict.Quorum)

	return nil
}

// stagedGate refuses a node with a machine config change staged for its
// next boot (render.Staged, as the Kubernetes upgrade refuses it): the
// reboot of its upgrade would activate a config nobody chose for it. where
// ends the pause's reason (what was not done, what the node keeps).
func (r *talosRun) stagedGate(ctx context.Context, n *osNode, where string) error {
	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP

	readCtx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	active, err := r.e.Talos.MachineConfig(readCtx, ip)

	cancel()

	if err != nil {
		err = fmt.Errorf("node %q: read machine config: %w", name, err)

		return r.e.pause(ctx, stage, name, err.Error()+where, actionTalosAccess, err)
	}

	staged, err := r.stagedConfig(ctx, &osNode{Node: n.Node, cfg: active})

	switch {
	case err != nil:
		return r.e.pause(ctx, stage, name, err.Error()+where, actionTalosAccess, err)
	case staged != "":
		err := fmt.Errorf("node %q: a machine config change is staged for the next reboot (%s): the upgrade's reboot would activate it", name, staged)

		return r.e.pause(ctx, stage, name, "checks: "+err.Error()+where, render.StagedAction(ip), err)
	}

	return nil
}

// stagedConfig says where n's persistent machine config differs from its
// active one (n.cfg): "" when nothing is staged (render.Staged).
func (r *talosRun) stagedConfig(ctx context.Context, n *osNode) (string, error) {
	readCtx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	defer cancel()

	persistent, err := r.e.Talos.PersistentMachineConfig(readCtx, n.InternalIP)
	if err != nil {
		return "", fmt.Errorf("node %q: read persistent machine config: %w", n.Name, err)
	}

	where, err := render.Staged(n.cfg, persistent)
	if err != nil {
		return "", fmt.Errorf("node %q: compare its active and persistent machine configs: %w", n.Name, err)
	}

	return where, nil
}
