package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/config"
	corev1 "k8s.io/api/core/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// Bounds and pace of the Talos OS upgrade besides those in Options.
const (
	// talosPollInterval is how often a rebooting node's Talos API is asked
	// again: Talos has no watch that survives a reboot, so this is polled.
	talosPollInterval = time.Second
	// talosPollCallTimeout bounds one call of that polling, so a node that
	// swallows packets costs one interval, not a whole dial timeout.
	talosPollCallTimeout = 5 * time.Second
)

// errUnreachable is a node that did not answer within a short look.
var errUnreachable = errors.New("Talos API unreachable")

// upgradeMark is what the Talos upgrade remembers, in Memo, of one node's
// upgrade to one target: all that cannot be read back from the node once it
// has rebooted.
type upgradeMark struct {
	// BootID is the node's boot ID read just before its Upgrade call; a
	// different boot ID later means the node rebooted since.
	BootID string `json:"bootID"`
	// Called is how an older ichor recorded that the Upgrade call returned:
	// read as Step reboot.
	Called bool `json:"called,omitempty"`
	// Step is the step of the upgrade announced last (stepInstall,
	// stepInstalled, stepReboot): written before its call, so that a run
	// that finds it asks the node what happened (engine_talos_once.go).
	Step string `json:"step,omitempty"`
	// Legacy is true once the node answered the Upgrade call with
	// MachineService.Upgrade (a Talos before 1.13): the node drains,
	// installs and reboots by itself, in a sequence of its own.
	Legacy bool `json:"legacy,omitempty"`
	// Fallback is the boot ID in which the node came back on another version
	// than the target (its old one: an A/B fallback) and the operation
	// paused; the next run, a resume, tries the node's upgrade again.
	Fallback string `json:"fallback,omitempty"`
	// From is the Talos version the node ran when its install was announced
	// ("" in a mark of an older ichor): a node that comes back on another
	// version than this one and the target did not fall back.
	From string `json:"from,omitempty"`
	// Expect is what the node must run once it has booted its installer
	// (its schematic, its extensions), recorded before the install: after
	// the reboot they are gone from the node's API (checkCarried).
	Expect *stages.InstallExpect `json:"expect,omitempty"`
}

// following reports whether the mark is of an upgrade under way: recorded
// and not ended by a fallback.
func (m *upgradeMark) following() bool { return m != nil && m.Fallback == "" }

// markKey is the Memo key of node's upgrade to target.
func markKey(node string, target stages.Version) string {
	return "talos/" + node + "/" + target.String()
}

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
	// etcd's health is read (see engine_talos_etcd.go).
	etcdNodes []stages.EtcdNode
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

	c, err := kube.StartCache(ctx, e.Kube)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("start: %w", ctx.Err())
		}

		return &PauseError{Reason: err.Error(), Action: actionResume, Err: err}
	}
	defer c.Stop()

	poll := e.talosPoll
	if poll <= 0 {
		poll = talosPollInterval
	}

	r := &talosRun{e: e, opts: opts, target: target, stage: stages.TalosOS{Target: target, Installers: opts.Installers}, cache: c, poll: poll}

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

	for _, n := range held {
		if node, ok := r.cache.Node(n.Name); ok && kube.CordonedByIchor(node) {
			r.e.node(name, n.Name, PhaseHeld, "held (%s), still cordoned by ichor: remove the hold to finish it, or kubectl uncordon %s",
				holdText(n), n.Name)

			continue
		}

		r.e.node(name, n.Name, PhaseHeld, "held (%s)", holdText(n))
	}

	var pending []*osNode

	for _, group := range visit {
		for _, n := range group {
			switch mark := r.mark(n.Name); {
			case n.unreachable == nil && n.version == r.target.String():
				r.e.node(name, n.Name, PhasePending, "on Talos %s: to verify", n.version)
			case mark.following() && (mark.step() != stepInstall || n.unreachable != nil):
				r.e.node(name, n.Name, PhasePending, "upgrade to %s under way (boot ID %s recorded): to follow", r.target, shortID(mark.BootID))
			case n.unreachable != nil:
				r.e.node(name, n.Name, PhasePending, "Talos API unreachable (%s): read again at its turn", stages.FirstLine(n.unreachable))
			default:
				pending = append(pending, n)

				installer, _ := r.installer(ctx, n.Node, n.cfg)
				r.e.node(name, n.Name, PhasePending, "to upgrade: Talos %s -> %s with %s", n.version, r.target, orUnknown(installer.Image))
			}
		}
	}

	if len(pending) > 0 {
		if err := r.checkStage(ctx, pending); err != nil {
			return err
		}
	}

	for _, group := range visit {
		if err := r.prePull(ctx, group); err != nil {
			return err
		}

		if err := r.runGroup(ctx, group); err != nil {
			return err
		}
	}

	return r.e.leftBehind(ctx, name, r.target, r.talosBehind, "the next run upgrades it")
}

// observe reads the cluster: the nodes to visit grouped in visiting order,
// each with its Talos version and active config (a node whose Talos API is
// unreachable is kept, to be read again at its turn: it may be rebooting),
// and the held nodes.
func (r *talosRun) observe(ctx context.Context) ([][]*osNode, []discovery.Node, error) {
	name := r.stage.Name()

	var snap *discovery.Snapshot

	err := kube.Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		snap, err = (&discovery.Discoverer{Kube: r.e.Kube}).Discover(ctx)

		return err
	})
	if err != nil {
		return nil, nil, r.e.pause(ctx, name, "", "read the cluster: "+err.Error(), actionResume, err)
	}

	var (
		candidates []discovery.Node
		held       []discovery.Node
	)

	for _, n := range snap.Nodes {
		if n.ControlPlane {
			r.controlPlanes++
			r.etcdNodes = append(r.etcdNodes, stages.EtcdNode{Name: n.Name, IP: n.InternalIP})
		}

		if n.Held {
			held = append(held, n)

			continue
		}

		if !n.IsTalos() {
			err := fmt.Errorf("node %q runs %q, not Talos", n.Name, n.OSImage)

			return nil, nil, r.e.pause(ctx, name, n.Name, err.Error(),
				fmt.Sprintf("hold it (kubectl annotate node %s %s=not-talos), then resume", n.Name, discovery.HoldAnnotation), err)
		}

		if n.InternalIP == "" {
			err := fmt.Errorf("node %q has no InternalIP address to reach its Talos API", n.Name)

			return nil, nil, r.e.pause(ctx, name, n.Name, err.Error(), "check the Node's status.addresses, then resume", err)
		}

		candidates = append(candidates, n)
	}

	byIP := map[string]*osNode{}
	byName := map[string]*osNode{}

	var ips []string

	for _, n := range candidates {
		on := &osNode{Node: n}
		byIP[n.InternalIP], byName[n.Name] = on, on
		ips = append(ips, n.InternalIP)
	}

	err = talos.ForEach(ctx, ips, r.opts.Concurrency, func(ctx context.Context, ip string) error {
		n := byIP[ip]

		version, cfg, err := r.read(ctx, n.Name, ip)

		switch {
		case talos.IsUnreachable(err):
			n.unreachable = err
		case err != nil:
			return err
		default:
			n.version, n.cfg = version, cfg
		}

		return nil
	})
	if err != nil {
		return nil, nil, r.e.pause(ctx, name, "", "read the nodes' Talos side: "+stages.FirstLine(err), actionTalosAccess, err)
	}

	order, err := stages.OrderNodes(candidates, stages.OrderOptions{Self: r.opts.Self, MaxUnavailable: r.opts.MaxUnavailable})
	if err != nil {
		return nil, nil, r.e.pause(ctx, name, "", err.Error(), actionResume, err)
	}

	return r.groups(order, byName), held, nil
}

// groups lays out the nodes in visiting order: each control plane alone,
// then the workers in batches of MaxUnavailable. A node whose upgrade is
// under way (ichor cordoned it, or its boot ID is recorded) goes first in its
// group: it is finished before anything else is made unavailable.
func (r *talosRun) groups(order stages.Order, byName map[string]*osNode) [][]*osNode {
	inProgress := func(name string) bool {
		if r.mark(name).following() {
			return true
		}

		n, ok := r.cache.Node(name)

		return ok && kube.CordonedByIchor(n)
	}

	firstInProgress := func(nodes []discovery.Node) []*osNode {
		out := make([]*osNode, 0, len(nodes))

		for _, n := range nodes {
			if inProgress(n.Name) {
				out = append(out, byName[n.Name])
			}
		}

		for _, n := range nodes {
			if !inProgress(n.Name) {
				out = append(out, byName[n.Name])
			}
		}

		return out
	}

	var groups [][]*osNode

	for _, n := range firstInProgress(order.ControlPlanes) {
		groups = append(groups, []*osNode{n})
	}

	workers := firstInProgress(slices.Concat(order.Workers...))
	for start := 0; start < len(workers); start += r.opts.MaxUnavailable {
		groups = append(groups, workers[start:min(start+r.opts.MaxUnavailable, len(workers))])
	}

	return groups
}

// checkStage runs the checks that gate the stage's first upgrade, on the
// nodes it will upgrade: the upgrade path from each one's Talos to the
// target, the target's support of the Kubernetes the cluster runs, each
// node's installer image, each node Ready. Nothing has changed yet when it
// refuses.
func (r *talosRun) checkStage(ctx context.Context, pending []*osNode) error {
	stage := r.stage.Name()

	var (
		path, installers, notReady, staged     []string
		pathNodes, installerNodes, stagedNodes []string
	)

	for _, n := range pending {
		switch where, err := r.stagedConfig(ctx, n); {
		case err != nil:
			return r.e.pause(ctx, stage, n.Name, "checks: "+err.Error(), actionTalosAccess, err)
		case where != "":
			staged = append(staged, fmt.Sprintf("%s (%s)", n.Name, where))
			stagedNodes = append(stagedNodes, n.Name)
		}

		if err := upgradePath(r.target, n.version); err != nil {
			path = append(path, fmt.Sprintf("%s: %v", n.Name, err))
			pathNodes = append(pathNodes, n.Name)
		}

		if _, err := r.installer(ctx, n.Node, n.cfg); err != nil {
			installers = append(installers, err.Error())
			installerNodes = append(installerNodes, n.Name)
		}

		if node, ok := r.cache.Node(n.Name); !ok || !nodeReady(node) {
			notReady = append(notReady, n.Name)
		}
	}

	running, err := kube.Observe(ctx, r.e.Kube)
	if err != nil {
		return r.e.pause(ctx, stage, "", "checks: read what the cluster runs: "+err.Error(), actionResume, err)
	}

	unsupported, err := kubernetesUnsupported(r.target, running)
	if err != nil {
		return r.refuse(ctx, nil, err.Error(), "upgrade kubectl-ichor to a release that knows the target (kubectl krew upgrade ichor)")
	}

	switch {
	case len(path) > 0:
		return r.refuse(ctx, pathNodes, "upgrade path: "+summarize(path),
			"upgrade through an intermediate Talos release first (see the Talos upgrade notes), or hold the nodes")
	case len(unsupported) > 0:
		return r.refuse(ctx, nil, fmt.Sprintf("Talos %s does not support the Kubernetes the cluster runs: %s", r.target, summarize(unsupported)),
			"move Kubernetes into the range the target supports first (kubectl ichor plan kubernetes --to ...)")
	case len(installers) > 0:
		return r.refuse(ctx, installerNodes, "installer: "+summarize(installers),
			installerAction(installerNodes, r.target))
	case len(staged) > 0:
		ip := ""
		if n := r.pendingNode(pending, stagedNodes[0]); n != nil {
			ip = n.InternalIP
		}

		return r.refuse(ctx, stagedNodes, "a machine config change is staged for the next reboot, which the upgrade's would activate: "+summarize(staged),
			render.StagedAction(ip))
	case len(notReady) > 0:
		return r.refuse(ctx, notReady, "not Ready: "+strings.Join(notReady, ", "),
			fmt.Sprintf("fix them, or hold them (kubectl annotate node %s %s=<reason>), then resume", notReady[0], discovery.HoldAnnotation))
	}

	return nil
}

// pendingNode is the pending node named name, nil when none.
func (r *talosRun) pendingNode(pending []*osNode, name string) *osNode {
	for _, n := range pending {
		if n.Name == name {
			return n
		}
	}

	return nil
}

// refuse pauses the stage before it changes anything, naming the node when
// there is one.
func (r *talosRun) refuse(ctx context.Context, nodes []string, reason, action string) error {
	node := ""
	if len(nodes) == 1 {
		node = nodes[0]
	}

	return r.e.pause(ctx, r.stage.Name(), node, "checks: "+reason, action, errors.New(reason))
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
	rebooted  time.Duration
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

	if err := upgradePath(r.target, version); err != nil {
		err = fmt.Errorf("node %q: upgrade path: %w", name, err)

		return r.e.pause(ctx, stage, name, "checks: "+err.Error(),
			"upgrade through an intermediate Talos release first (see the Talos upgrade notes), or hold the node", err)
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

	drained, err := r.e.cordonAndDrain(ctx, r.opts, stage, name)
	if err != nil {
		return err
	}

	readCtx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	boot, err := r.e.Talos.BootID(readCtx, ip)

	cancel()

	if err != nil {
		return r.undo(ctx, name, fmt.Errorf("node %q: before its upgrade: %w", name, err), actionTalosAccess)
	}

	n.cfg = cfg

	mark := upgradeMark{BootID: boot, Step: stepInstall, From: version}
	if !choice.Expect.Empty() {
		mark.Expect = &choice.Expect
	}

	return r.drive(ctx, n, mark, outcome{from: version, installer: installer, drained: drained}, installer, actInstall)
}

// undo uncordons a node whose upgrade failed before its Upgrade call took
// (nothing changed on it) and pauses with err.
func (r *talosRun) undo(ctx context.Context, name string, err error, action string) error {
	if ctx.Err() != nil {
		return r.e.pause(ctx, r.stage.Name(), name, "", "", err)
	}

	reason := err.Error() + " (uncordoned again)"
	if uerr := kube.Uncordon(ctx, r.e.Kube, name); uerr != nil {
		reason = err.Error() + " (and " + uerr.Error() + ")"
		err = errors.Join(err, uerr)
	}

	return r.e.pause(ctx, r.stage.Name(), name, reason, action, err)
}

// follow waits, bounded by RebootTimeout, for the node to reboot out of the
// boot mark recorded and come back on the target, then verifies it. A node
// that comes back on another version fell back to its previous A/B slot:
// that pauses.
func (r *talosRun) follow(ctx context.Context, n *osNode, mark upgradeMark, out outcome) error {
	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP
	start := time.Now()
	deadline := start.Add(r.opts.RebootTimeout)

	var (
		lastErr  error
		fellBack string // the boot ID the node came back in, not on the target
		running  string
		sameBoot bool
	)

	err := r.pollUntil(ctx, deadline, r.opts.RebootTimeout, func(ctx context.Context) (bool, string, error) {
		boot, err := r.e.Talos.BootID(ctx, ip)

		switch {
		case talos.IsPermissionDenied(err):
			return false, "", err
		case err != nil && (talos.IsUnreachable(err) || errors.Is(err, context.DeadlineExceeded)):
			lastErr = err

			return false, "rebooting: Talos API unreachable", nil
		case err != nil:
			lastErr = err

			return false, "Talos API: " + stages.FirstLine(err), nil
		case boot == mark.BootID && mark.step() != stepReboot:
			sameBoot = true // up in the boot its install was announced in: no reboot asked

			return true, "", nil
		case boot == mark.BootID:
			return false, "waiting for the reboot (boot ID unchanged)", nil
		}

		version, err := r.e.Talos.Version(ctx, ip)
		if err != nil {
			lastErr = err

			return false, "rebooted; reading its version: " + stages.FirstLine(err), nil
		}

		if version != r.target.String() {
			fellBack, running = boot, version
		}

		return true, "", nil
	}, func(waiting string) {
		r.e.node(stage, name, PhaseUpgrading, "%s (waited %s)", waiting, time.Since(start).Round(time.Second))
	})

	var timeout *kube.WaitTimeoutError

	switch {
	case errors.As(err, &timeout):
		reason := fmt.Sprintf("did not come back on Talos %s within %s of its Upgrade call: %s", r.target, timeout.After, timeout.Waiting)
		if lastErr != nil {
			reason += " (last error: " + stages.FirstLine(lastErr) + ")"
		}

		return r.e.pause(ctx, stage, name, reason+"; the node stays cordoned",
			fmt.Sprintf("look at the node (its console; talosctl -n %s dmesg once its API answers); once it runs Talos %s, resume "+
				"(kubectl ichor resume) to verify it and go on, or abort (kubectl ichor abort uncordons it)", ip, r.target),
			fmt.Errorf("node %q: reboot: %w", name, err))
	case err != nil:
		return r.e.pause(ctx, stage, name, fmt.Sprintf("node %q: follow its reboot: %v", name, err), actionTalosAccess, err)
	case sameBoot:
		return errSameBoot
	case fellBack != "":
		mark.Fallback = fellBack
		if err := r.setMark(ctx, name, mark); err != nil && ctx.Err() != nil {
			return fmt.Errorf("stage %s: node %q: %w", stage, name, ctx.Err())
		}

		if mark.From != "" && running != mark.From {
			// Neither the version it ran nor the target: it booted an install
			// nobody chose here (staged before, or installed since).
			err := fmt.Errorf("node %q: it rebooted (boot ID changed) into Talos %s, neither the target %s nor the %s it ran: not an A/B fallback, an install this operation did not choose",
				name, running, r.target, mark.From)

			return r.e.pause(ctx, stage, name, err.Error()+"; the node stays cordoned",
				fmt.Sprintf("inspect the node (talosctl -n %s version; talosctl -n %s logs machined | grep upgrade), then resume to upgrade it from %s "+
					"(kubectl ichor resume), or abort (kubectl ichor abort uncordons it)", ip, ip, running),
				err)
		}

		err := fmt.Errorf("node %q: A/B fallback: it rebooted (boot ID changed) but runs Talos %s, not %s", name, running, r.target)

		return r.e.pause(ctx, stage, name,
			err.Error()+": the new version did not boot and Talos went back to the previous boot slot; the node stays cordoned",
			fmt.Sprintf("inspect the node (talosctl -n %s dmesg; talosctl -n %s logs machined), then resume to try its upgrade again "+
				"(kubectl ichor resume), or abort (kubectl ichor abort uncordons it)", ip, ip),
			err)
	}

	out.rebooted = time.Since(start)

	return r.verify(ctx, n, deadline, r.opts.RebootTimeout, out)
}

// verify waits until deadline (bound is its length, for messages) for the
// Node Ready on the target's osImage and, on a control plane, etcd healthy
// with this node in it, then uncordons the node if ichor cordoned it.
func (r *talosRun) verify(ctx context.Context, n *osNode, deadline time.Time, bound time.Duration, out outcome) error {
	stage, name := r.stage.Name(), n.Name
	osImage := talosOSImage(r.target)
	start := time.Now()

	expect := "node Ready, osImage " + osImage
	if n.ControlPlane {
		expect += ", etcd healthy"
	}

	r.e.node(stage, name, PhaseVerifying, "waiting for %s", expect)

	report := func(waiting string) {
		r.e.node(stage, name, PhaseVerifying, "%s (waited %s)", waiting, time.Since(start).Round(time.Second))
	}

	err := r.cache.Wait(ctx, time.Until(deadline), r.nodeOnTarget(name, osImage), report)

	var timeout *kube.WaitTimeoutError

	switch {
	case errors.As(err, &timeout):
		return r.e.pause(ctx, stage, name,
			fmt.Sprintf("verify: %s after %s; the node stays cordoned if ichor cordoned it", timeout.Waiting, bound),
			verifyAction(name), fmt.Errorf("node %q: verify: %w", name, err))
	case err != nil:
		return r.e.pause(ctx, stage, name, "verify: "+err.Error(), actionResume, fmt.Errorf("node %q: verify: %w", name, err))
	}

	etcd := ""

	if n.ControlPlane {
		var verdict stages.EtcdVerdict

		// ReadEtcd bounds each of its calls; it reads several in turn, so it
		// gets the run's ctx, not the poll's short one.
		err := r.pollUntil(ctx, deadline, bound, func(context.Context) (bool, string, error) {
			verdict = r.readEtcd(ctx).Judge("")
			if waiting := verdict.Rejoined(name); waiting != "" {
				return false, "etcd: " + waiting, nil
			}

			return true, "", nil
		}, report)

		switch {
		case errors.As(err, &timeout):
			return r.e.pause(ctx, stage, name,
				fmt.Sprintf("verify: %s after %s; the node stays cordoned if ichor cordoned it", timeout.Waiting, bound),
				verdict.LookAction("resume (kubectl ichor resume)"), fmt.Errorf("node %q: verify etcd: %w", name, err))
		case err != nil:
			return r.e.pause(ctx, stage, name, "verify etcd: "+err.Error(), actionResume, fmt.Errorf("node %q: verify etcd: %w", name, err))
		}

		etcd = fmt.Sprintf("etcd member healthy, %d of %d voter(s) healthy", verdict.Left, verdict.Voters)
	}

	if err := r.checkCarried(ctx, n, deadline, bound, report); err != nil {
		return err
	}

	uncordoned := false

	if node, ok := r.cache.Node(name); ok && kube.CordonedByIchor(node) {
		if err := kube.Uncordon(ctx, r.e.Kube, name); err != nil {
			return r.e.pause(ctx, stage, name, err.Error(), actionResume, err)
		}

		uncordoned = true
	}

	r.e.node(stage, name, PhaseDone, "%s", out.describe(r.target, osImage, etcd, uncordoned))

	return nil
}

// describe is a node's last line: "Talos v1.12.4 -> v1.13.9 with
// ghcr.io/siderolabs/installer:v1.13.9, drained 3 pod(s), rebooted in 41s,
// node Ready on Talos (v1.13.9), etcd 3 voter(s), uncordoned".
func (o outcome) describe(target stages.Version, osImage, etcd string, uncordoned bool) string {
	var parts []string

	switch {
	case o.already:
		parts = append(parts, "on Talos "+target.String()+" already")
	case o.from != "":
		parts = append(parts, fmt.Sprintf("Talos %s -> %s with %s", o.from, target, o.installer))
	default:
		parts = append(parts, "upgraded to Talos "+target.String())
	}

	if o.drained != "" {
		parts = append(parts, o.drained)
	}

	if o.rebooted > 0 {
		parts = append(parts, "rebooted in "+o.rebooted.Round(time.Second).String())
	}

	parts = append(parts, "node Ready on "+osImage)

	if etcd != "" {
		parts = append(parts, etcd)
	}

	if uncordoned {
		parts = append(parts, "uncordoned")
	}

	return strings.Join(parts, ", ")
}

// nodeOnTarget is the Condition that the Node is Ready and reports the
// target's osImage.
func (r *talosRun) nodeOnTarget(name, osImage string) kube.Condition {
	return func() (bool, string) {
		n, ok := r.cache.Node(name)
		if !ok {
			return false, "no Node " + name
		}

		var waiting []string

		if got := n.Status.NodeInfo.OSImage; got != osImage {
			waiting = append(waiting, fmt.Sprintf("osImage %q, want %q", got, osImage))
		}

		if ready, why := kube.NodeReady(n); !ready {
			waiting = append(waiting, "node NotReady"+why)
		}

		return len(waiting) == 0, strings.Join(waiting, "; ")
	}
}

// pollUntil calls check every poll interval, each call under its own short
// deadline, until it is done (nil) or fails (its error), ctx ends (ctx's
// error) or deadline passes (a *kube.WaitTimeoutError naming bound and what
// check still waited for). report hears what it waits for whenever that
// changes, and every kube.DefaultHeartbeat while it does not.
func (r *talosRun) pollUntil(ctx context.Context, deadline time.Time, bound time.Duration,
	check func(ctx context.Context) (done bool, waiting string, err error), report func(waiting string),
) error {
	var (
		last     string
		reported time.Time
	)

	for {
		callCtx, cancel := context.WithTimeout(ctx, max(min(talosPollCallTimeout, time.Until(deadline)), r.poll))
		done, waiting, err := check(callCtx)

		cancel()

		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return err
		case done:
			return nil
		}

		if waiting != last || time.Since(reported) >= kube.DefaultHeartbeat {
			last, reported = waiting, time.Now()
			report(waiting)
		}

		remaining := time.Until(deadline)
		if remaining <= 0 {
			return &kube.WaitTimeoutError{After: bound, Waiting: waiting}
		}

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(r.poll, remaining)):
		}
	}
}

// read reads a node's Talos version and active config, under one deadline.
func (r *talosRun) read(ctx context.Context, name, ip string) (string, config.Provider, error) {
	ctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	defer cancel()

	version, err := r.e.Talos.Version(ctx, ip)
	if err != nil {
		return "", nil, fmt.Errorf("node %q: %w", name, err)
	}

	cfg, err := r.e.Talos.MachineConfig(ctx, ip)
	if err != nil {
		return "", nil, fmt.Errorf("node %q: %w", name, err)
	}

	return version, cfg, nil
}

// readPatiently is read, tried again while the node is unreachable, for at
// most talosReadTimeout (a node, or the endpoint that routes to it, still
// rebooting).
func (r *talosRun) readPatiently(ctx context.Context, name, ip string) (string, config.Provider, error) {
	var (
		version string
		cfg     config.Provider
		lastErr error
	)

	err := r.pollUntil(ctx, time.Now().Add(talosReadTimeout), talosReadTimeout, func(ctx context.Context) (bool, string, error) {
		var err error

		version, cfg, err = r.read(ctx, name, ip)

		switch {
		case err == nil:
			return true, "", nil
		case talos.IsUnreachable(err) || errors.Is(err, context.DeadlineExceeded):
			lastErr = err

			return false, "Talos API unreachable", nil
		}

		return false, "", err
	}, func(waiting string) {
		r.e.node(r.stage.Name(), name, PhasePending, "%s: reading it again", waiting)
	})

	var timeout *kube.WaitTimeoutError
	if errors.As(err, &timeout) && lastErr != nil {
		return "", nil, fmt.Errorf("%w (for %s)", lastErr, timeout.After)
	}

	return version, cfg, err
}

// mark reads node's upgrade mark from Memo; nil when there is none (or it
// does not parse: the node's version then decides).
func (r *talosRun) mark(node string) *upgradeMark {
	v, ok := r.e.Memo.Get(markKey(node, r.target))
	if !ok || v == "" {
		return nil
	}

	var m upgradeMark
	if err := json.Unmarshal([]byte(v), &m); err != nil || m.BootID == "" {
		return nil
	}

	return &m
}

// setMark writes node's upgrade mark and returns once it is durable.
func (r *talosRun) setMark(ctx context.Context, node string, m upgradeMark) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}

	return r.e.Memo.Set(ctx, markKey(node, r.target), string(b))
}

// upgradePath says whether a node running the Talos version running may be
// upgraded to target: not a downgrade, and allowed by machinery's upgrade
// table (which also refuses a target minor it does not know).
func upgradePath(target stages.Version, running string) error {
	v, err := stages.ParseVersion(running)
	if err != nil {
		return fmt.Errorf("running Talos version: %w", err)
	}

	if target.Compare(v) < 0 {
		return fmt.Errorf("%s is older than the running %s: downgrades are not supported", target, v)
	}

	host, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: running})
	if err != nil {
		return fmt.Errorf("running Talos version %q: %w", running, err)
	}

	tv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: target.String()})
	if err != nil {
		return fmt.Errorf("target %s: %w", target, err)
	}

	return tv.UpgradeableFrom(host)
}

// kubernetesUnsupported returns one line for each Kubernetes version the
// cluster runs that Talos target does not support, naming the nodes that run
// it. Versions that do not parse are not judged.
func kubernetesUnsupported(target stages.Version, running []kube.Running) ([]string, error) {
	tv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: target.String()})
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", target, err)
	}

	where := map[string][]string{}

	var versions []string

	for _, run := range running {
		if _, err := stages.ParseVersion(run.Version); err != nil {
			continue
		}

		if _, seen := where[run.Version]; !seen {
			versions = append(versions, run.Version)
		}

		if !slices.Contains(where[run.Version], run.Node) {
			where[run.Version] = append(where[run.Version], run.Node)
		}
	}

	slices.Sort(versions)

	var out []string

	for _, v := range versions {
		kv, err := compatibility.ParseKubernetesVersion(strings.TrimPrefix(v, "v"))
		if err != nil {
			continue
		}

		if err := kv.SupportedWith(tv); err != nil {
			nodes := where[v]
			slices.Sort(nodes)

			out = append(out, fmt.Sprintf("Kubernetes %s on %s", v, strings.Join(nodes, ", ")))
		}
	}

	return out, nil
}

// talosOSImage is the osImage a Node on Talos version v reports.
func talosOSImage(v stages.Version) string {
	return fmt.Sprintf("Talos (%s)", v)
}

// nodeReady reports the Node's Ready condition.
func nodeReady(n *corev1.Node) bool {
	ready, _ := kube.NodeReady(n)

	return ready
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
