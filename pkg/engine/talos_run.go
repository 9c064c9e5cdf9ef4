package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"

	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file is the Talos OS upgrade's run: the single TalosOS stage, its nodes group by
// group, each node's visit up to its install (checks, pull, etcd gate, cordon, drain,
// boot ID), which talos_install.go then drives.

// Bounds and pace of the Talos OS upgrade besides those in Options.
const (
	// talosPollInterval is how often a rebooting node's Talos API is asked
	// again: Talos has no watch that survives a reboot, so this is polled.
	// Half a second: a node's boot is seen a quarter second after it, on
	// average, for two calls a second to each node of a batch.
	talosPollInterval = 500 * time.Millisecond
	// talosPollCallTimeout bounds one call of that polling, so a node that
	// swallows packets costs one interval, not a whole dial timeout.
	talosPollCallTimeout = 5 * time.Second
)

// errUnreachable is a node that did not answer within a short look.
var errUnreachable = errors.New("Talos API unreachable") //nolint:staticcheck // ST1005: Talos is a name

// talosRun is one Run of a Talos OS upgrade.
type talosRun struct {
	e      *Engine
	opts   Options
	target stages.Version
	stage  stages.TalosOS
	cache  *kube.Cache
	poll   time.Duration
	// controlPlanes counts the control-plane Nodes: the etcd members a
	// healthy cluster has.
	controlPlanes int
	// etcdNodes are the control-plane Nodes, held ones included: where
	// etcd's health is read (see etcd_gate.go), through etcd.
	etcdNodes []stages.EtcdNode
	etcd      *stages.EtcdChain
	// nodes are the cluster's Nodes as the stage's start read them, held ones
	// marked: what the version rules judge the Kubernetes it runs from.
	nodes []discovery.Node
}

// osNode is a node the Talos upgrade visits, as read at the stage's start.
type osNode struct {
	discovery.Node
	// version is the Talos version it ran; "" when its Talos API did not
	// answer (unreachable says why: it may be rebooting).
	version     string
	cfg         config.Provider
	unreachable error
	// pulled is the installer pulled on the node by this run (prePull).
	pulled string
}

// runTalos drives the single TalosOS stage: each node, control planes one
// at a time then workers a batch at a time, is checked, cordoned and
// drained, upgraded with its installer image and followed through its
// reboot (boot ID, version, Node Ready on the new osImage, etcd on a control
// plane), then uncordoned. Every step is re-derived from the node and the
// mark Memo keeps, so a Run on a half-done cluster finishes it.
func (e *Engine) runTalos(ctx context.Context, opts Options) error {
	target, err := stages.ParseVersion(opts.Target)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}

	if e.Kube == nil || e.Talos == nil {
		return errors.New("the engine needs Kube and Talos clients")
	}

	if e.Memo == nil {
		return errors.New("the Talos upgrade needs a Memo: it keeps each node's boot ID across a restart of the runner")
	}

	c, err := e.startCache(ctx)
	if err != nil {
		return err
	}
	defer c.Stop()

	poll := e.talosPoll
	if poll <= 0 {
		poll = talosPollInterval
	}

	r := &talosRun{e: e, opts: opts, target: target, stage: stages.TalosOS{Target: target, Installers: opts.Installers}, cache: c, poll: poll}
	if opts.HandOver != nil {
		r.opts.HandOver = etcdHandOver{HandOver: opts.HandOver, r: r}
	}

	return r.run(ctx)
}

// run reads the nodes, runs the stage's checks when any node is to be
// upgraded, visits the groups in order, and ends with the last look for a
// node that joined since (leftBehind).
func (r *talosRun) run(ctx context.Context) error {
	name := r.stage.Name()
	r.e.stage(1, 1, name)

	visit, held, err := r.observe(ctx)
	if err != nil {
		return err
	}

	r.etcd = &stages.EtcdChain{Reader: r.e.Talos, ControlPlanes: r.etcdNodes, Gap: r.e.etcdGap}
	r.takeEtcdPasses()

	r.e.reportHeld(name, held, r.cache)

	// The first group's look at etcd is read while the stage's checks run.
	if len(visit) > 0 && !r.opts.PullOnly {
		r.warmEtcd(ctx, visit[0])
	}

	var pending []*osNode

	for _, group := range visit {
		for _, n := range group {
			if r.toUpgrade(n) {
				pending = append(pending, n)
			}
		}
	}

	facts, err := r.readStart(ctx, pending, !r.opts.PullOnly)
	if err != nil {
		return err
	}

	for _, group := range visit {
		for _, n := range group {
			switch mark := r.mark(n.Name); {
			case r.toUpgrade(n):
				r.e.node(name, n.Name, PhasePending, "to upgrade: Talos %s -> %s with %s", n.version, r.target, orUnknown(facts[n.Name].installer.Image))
			case n.unreachable == nil && n.version == r.target.String():
				r.e.node(name, n.Name, PhasePending, "on Talos %s: to verify", n.version)
			case mark.following() && (mark.step() != stepInstall || n.unreachable != nil):
				r.e.node(name, n.Name, PhasePending, "upgrade to %s under way (boot ID %s recorded): to follow", r.target, shortID(mark.BootID))
			case n.unreachable != nil:
				r.e.node(name, n.Name, PhasePending, "Talos API unreachable (%s): read again at its turn", stages.FirstLine(n.unreachable))
			}
		}
	}

	if r.opts.PullOnly {
		for _, group := range visit {
			if err := r.prePull(ctx, group); err != nil {
				return err
			}
		}

		return nil
	}

	if len(pending) > 0 {
		if err := r.checkStage(ctx, pending, facts); err != nil {
			return err
		}
	}

	// While a group is upgraded, the next one's installers are pulled (pullAhead).
	var ahead *pullingAhead
	defer func() { ahead.stop() }()

	for i, group := range visit {
		r.warmEtcd(ctx, group)

		ahead.wait()

		if err := r.prePull(ctx, group); err != nil {
			return err
		}

		if i+1 < len(visit) {
			ahead = r.pullAhead(ctx, visit[i+1])
		}

		stopPassing := r.etcdBeforeHandOver(ctx, visit, i)
		err := r.runGroup(ctx, group)

		stopPassing()

		if err != nil {
			return err
		}
	}

	return r.e.leftBehind(ctx, name, r.target, r.talosBehind, "the next run upgrades it")
}

// toUpgrade reports whether the stage's start upgrades n: its Talos API
// answered, it does not run the target, and no upgrade of it is under way
// past its Install call (one announced but not installed is made again).
func (r *talosRun) toUpgrade(n *osNode) bool {
	mark := r.mark(n.Name)

	return n.unreachable == nil && n.version != r.target.String() && (!mark.following() || mark.step() == stepInstall)
}

// warmEtcd starts reading etcd, when a control plane of group is to be
// visited and no view of the last second is at hand, while its installer is
// pulled: its gate before the cordon then finds that view, a second sooner.
// The read is bounded (each call, and the gap) and made once whoever waits.
func (r *talosRun) warmEtcd(ctx context.Context, group []*osNode) {
	for _, n := range group {
		if n.ControlPlane {
			go r.etcd.Recent(ctx)

			return
		}
	}
}

// etcdBeforeHandOver reads a pass of etcd every gap while group i holds the
// runner's own node, or the group after it does and group i is a batch of
// workers, when the runner may hand over: the
// passes left for the successor (etcdHandOver) then hold one a gap or more old,
// and its first read of etcd, verifying the control planes done, reads one pass
// at once rather than wait out the gap after the pass read at the ask. The
// passes stop, and the returned stop waits for them, when the group ends.
func (r *talosRun) etcdBeforeHandOver(ctx context.Context, visit [][]*osNode, i int) (stop func()) {
	if !r.passesBeforeHandOver(visit, i) {
		return func() {}
	}

	return r.etcdWhileDown(ctx, "")
}

// passesBeforeHandOver reports whether etcdBeforeHandOver reads passes during group i.
func (r *talosRun) passesBeforeHandOver(visit [][]*osNode, i int) bool {
	if r.opts.HandOver == nil || r.opts.StayOnNode || len(r.etcdNodes) == 0 || r.etcd == nil {
		return false
	}

	holdsSelf := func(j int) bool {
		return j < len(visit) && slices.ContainsFunc(visit[j], func(n *osNode) bool { return n.Name == r.opts.Self })
	}

	// A control plane of the group before reboots: its member does not answer, and a
	// pass without it serves no read (its verification reads without it meanwhile).
	// The runner's own control plane is rebooted only after the hand-over.
	rebootsMember := slices.ContainsFunc(visit[i], func(n *osNode) bool { return n.ControlPlane })

	return holdsSelf(i) || (holdsSelf(i+1) && !rebootsMember)
}

// runGroup visits a group's nodes (several at once for a worker batch).
// Every node of a batch finishes its step; the first failure, in the
// batch's order, is returned.
func (r *talosRun) runGroup(ctx context.Context, group []*osNode) error {
	errs := make([]error, len(group))

	var wg sync.WaitGroup

	for i, n := range group {
		wg.Go(func() { errs[i] = r.visit(ctx, n) })
	}

	wg.Wait()

	for _, err := range errs {
		if err != nil {
			return err
		}
	}

	return nil
}

// visit takes one node to the target: a node whose Upgrade call was made is
// followed through its reboot; one already on the target is only verified
// (and uncordoned if ichor cordoned it); any other is upgraded.
func (r *talosRun) visit(ctx context.Context, n *osNode) error {
	stage, name := r.stage.Name(), n.Name
	mark := r.mark(name)

	if mark.following() {
		// Under way: what the node reports decides the next step, never the
		// absence of a record.
		r.e.node(stage, name, PhaseUpgrading, "following the upgrade to %s: announced (%s) in boot %s", r.target, mark.step(), shortID(mark.BootID))

		return r.drive(ctx, n, *mark, outcome{}, "", actFollow)
	}

	version, cfg, err := r.read(ctx, name, n.InternalIP)
	if err != nil && (talos.IsUnreachable(err) || errors.Is(err, errUnreachable)) {
		version, cfg, err = r.readPatiently(ctx, name, n.InternalIP)
	}

	if err != nil {
		return r.e.pause(ctx, stage, name, err.Error(), actionTalosAccess, err)
	}

	if version == r.target.String() {
		// On the target: upgraded before this run (by it, if its mark is
		// there), only verified now.
		return r.verify(ctx, n, time.Now().Add(r.opts.VerifyTimeout), r.opts.VerifyTimeout, outcome{already: mark == nil})
	}

	return r.upgrade(ctx, n, version, cfg)
}

// outcome is what a node's visit did, for its last line.
type outcome struct {
	already   bool   // it was on the target before this run touched it
	from      string // the version it was upgraded from
	installer string
	drained   string
	// drain, when not nil, is the node's drain still waiting for its pods to
	// stop: drive joins it before the reboot, and drained says it then.
	drain    *drainUnderway
	rebooted time.Duration
}

// upgrade checks the node, cordons and drains it, records its boot ID,
// calls Upgrade under its own deadline and follows the reboot.
func (r *talosRun) upgrade(ctx context.Context, n *osNode, version string, cfg config.Provider) error {
	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP

	choice, err := r.installer(ctx, n.Node, cfg)
	if err != nil {
		return r.e.pause(ctx, stage, name, "checks: "+err.Error(), installerAction([]string{name}, r.target), err)
	}

	installer := choice.Image

	// The plan's upgrade path rule again, on the version the node runs at its turn.
	if v := compat.TalosUpgradeable([]compat.Node{{Name: name, Talos: version}}, compat.Version(r.target)); !v.Allowed {
		reason, action, _ := verdictPause(compat.NameTalosUpgradeable, v)

		return r.e.pause(ctx, stage, name, "checks: "+reason, action, v.Err())
	}

	node, ok := r.cache.Node(name)
	if !ok {
		err := fmt.Errorf("node %q: no such Node", name)

		return r.e.pause(ctx, stage, name, err.Error(), actionResume, err)
	}

	if ready, why := kube.NodeReady(node); !ready {
		err := fmt.Errorf("node %q is NotReady%s", name, why)

		return r.e.pause(ctx, stage, name, "checks: "+err.Error(),
			fmt.Sprintf("fix it, or hold it (kubectl annotate node %s %s=<reason>), then resume", name, discovery.HoldAnnotation), err)
	}

	if err := r.stagedGate(ctx, n, r.untouched(name)); err != nil {
		return err
	}

	// Its installer pulls on it before it is cordoned (its batch's pre-pull
	// did, unless the node was unreachable then).
	if err := r.ensurePulled(ctx, n, installer); err != nil {
		return err
	}

	if n.ControlPlane {
		if err := r.etcdGate(ctx, n); err != nil {
			return err
		}
	}

	// On a Talos whose install leaves the node's pods running, the install goes
	// on once every eviction is accepted, while the pods stop (their grace
	// periods run beside the install), and the drain is joined before the
	// reboot (drive). On an older Talos the one Upgrade call installs and
	// reboots: the drain ends first.
	var drain *drainUnderway

	drained := ""

	if lifecycleInstall(version) {
		if drain, err = r.e.startDrain(ctx, r.opts, stage, name, r.ownPod(name, version)); err != nil {
			return err
		}

		defer drain.stop()
	} else {
		evicted, err := r.e.cordonAndDrain(ctx, r.opts, stage, name, r.ownPod(name, version), "")
		if err != nil {
			return err
		}

		drained = drainedSummary(evicted)
	}

	var boot string

	err = r.e.whileUnreachable(ctx, r.opts.UnreachableGrace, name, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
		defer cancel()

		var err error

		boot, err = r.e.Talos.BootID(ctx, ip)

		return err
	})
	if err != nil {
		return r.undo(ctx, name, fmt.Errorf("node %q: before its upgrade: %w", name, err), actionTalosAccess)
	}

	n.cfg = cfg

	mark := upgradeMark{BootID: boot, Step: stepInstall, From: version}
	if !choice.Expect.Empty() {
		mark.Expect = &choice.Expect
	}

	return r.drive(ctx, n, mark, outcome{from: version, installer: installer, drained: drained, drain: drain}, installer, actInstall)
}

// undo uncordons a node whose upgrade failed before its Upgrade call took
// (nothing changed on it) and pauses with err.
func (r *talosRun) undo(ctx context.Context, name string, err error, action string) error {
	if ctx.Err() != nil {
		return r.e.pause(ctx, r.stage.Name(), name, "", "", err)
	}

	reason := err.Error() + " (uncordoned again)"
	if uerr := r.e.nodes.Uncordon(ctx, name); uerr != nil {
		reason = err.Error() + " (and " + uerr.Error() + ")"
		err = errors.Join(err, uerr)
	}

	return r.e.pause(ctx, r.stage.Name(), name, reason, action, err)
}

// shortID is the start of a boot ID, enough to tell two apart in a line.
func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}

	return id
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}

	return s
}
