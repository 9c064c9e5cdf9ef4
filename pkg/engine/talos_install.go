package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file drives a node's upgrade once it is under way (drive): each Install and
// Reboot announced in the node's mark before it is made and gated again right before
// it, a broken-off call asked of the node rather than made twice, until the node
// reboots into the target (talos_reboot.go follows it).

// transientInstallError reports whether err, from an Install call, may have
// left the node in any state (the connection broke: stream reset, gRPC
// Unavailable, the endpoint down) rather than saying the install failed.
func transientInstallError(err error) bool {
	if talos.IsUnreachable(err) || errors.Is(err, talos.ErrInstallStreamEnded) {
		return true
	}

	switch client.StatusCode(err) {
	case codes.Unavailable, codes.Aborted:
		return true
	}

	return false
}

// talosEtcdRefusal is how MachineService.Upgrade (Talos before 1.13) says
// its etcd checks refused a control plane's upgrade.
const talosEtcdRefusal = "error validating etcd for upgrade"

// installAttempts bounds the Install calls tried again after a transient
// error in one boot (each only when the node says no install ran).
const installAttempts = 5

// installLost is how an Install call ended without an answer that says
// what the node did.
type installLost int

const (
	lostNothing  installLost = iota // the call answered
	lostStream                      // the stream broke (Unavailable, a reset, an end without exit code)
	lostDeadline                    // the call ran out its own bound (UpgradeTimeout)
)

// drive takes a node whose upgrade is under way to the target, deciding
// each step from what the node reports: first is actInstall for a fresh
// upgrade (mark not yet written), else actFollow. Right before each Install
// and each Reboot the node is gated again (etcd on a control plane, a
// staged config: gateBefore). It returns once the node is verified, or with
// a pause.
func (r *talosRun) drive(ctx context.Context, n *osNode, mark upgradeMark, out outcome, installer string, first resumeAction) error {
	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP
	deadline := time.Now().Add(r.opts.UpgradeTimeout + r.opts.RebootTimeout)
	act := first
	attempts := 0
	seenVersion := "?"
	lost := lostNothing

	var (
		unreadSince time.Time // machined's log unreadable since
		seen        nodeSeen
	)

	// A fresh upgrade asks the node too: an install may have ended in this boot
	// with no record of it (the state replaced, an operation aborted between its
	// install and its reboot). Only a log that no longer reaches back is not
	// taken as a reason to pause: nothing recorded started an install.
	fresh := first == actInstall
	look := true

	for {
		if look {
			var err error
			if seen, err = r.look(ctx, n, mark); err != nil {
				return err
			}

			if ev := seen.evidence; installer == "" && seen.evidenceErr == nil && (ev.State == talos.InstallDone || ev.State == talos.InstallRunning) {
				// What the node installs is judged against the installer chosen for it.
				choice, err := r.installer(ctx, n.Node, n.cfg)
				if err != nil {
					return r.e.pause(ctx, stage, name, "checks: "+err.Error()+"; the node stays cordoned", installerAction([]string{name}, r.target), err)
				}

				installer = choice.Image
				if mark.Expect == nil && !choice.Expect.Empty() {
					mark.Expect = &choice.Expect
				}
			}

			act = decide(mark, seen, r.target.String(), installer)
			if fresh && act == actPause {
				act = actInstall
			}

			fresh = false
			if seen.version != "" {
				seenVersion = seen.version
			}
			if act == actFollow && seen.reachable && mark.step() != stepReboot {
				mark.Step = stepReboot // rebooted since: there is nothing else to do but follow
			}
			if act != actUnread {
				unreadSince = time.Time{}
			}
		}

		look = true

		if lost == lostDeadline {
			// The Install call ran out its bound: the installer may still run, or
			// have ended, on the node. Only the node's word that it installed
			// the chosen installer, or that it installs still, goes on.
			switch act {
			case actInstall, actPause:
				return r.pendingPause(ctx, n, seen)
			}
		}

		switch act {
		case actVerify:
			return r.verify(ctx, n, time.Now().Add(r.opts.VerifyTimeout), r.opts.VerifyTimeout, out)
		case actFollow:
			err := r.follow(ctx, n, mark, out)
			if !errors.Is(err, errSameBoot) {
				return err
			}

			r.e.node(stage, name, PhaseUpgrading, "Talos API answers again in boot %s, the one the install was announced in: looking at what it did", shortID(mark.BootID))

			continue
		case actReboot:
			if out.drain != nil {
				evicted, err := r.e.join(ctx, r.opts, stage, out.drain, r.installKept())
				if err != nil {
					return err
				}

				out.drain, out.drained = nil, drainedSummary(evicted)
			}

			if err := r.drainLeft(ctx, n); err != nil {
				return err
			}

			if err := r.gateBefore(ctx, n, momentReboot); err != nil {
				return err
			}

			mark.Step = stepReboot
			if err := r.writeMark(ctx, name, mark); err != nil {
				return err
			}

			r.e.node(stage, name, PhaseUpgrading, "Talos %s installed in boot %s: rebooting into it", r.target, shortID(mark.BootID))

			callCtx, cancel := context.WithTimeout(ctx, talosReadTimeout)
			err := r.e.Talos.Reboot(callCtx, ip)

			cancel()

			switch {
			case ctx.Err() != nil:
				return fmt.Errorf("stage %s: node %q: reboot: %w", stage, name, ctx.Err())
			case talos.IsPermissionDenied(err):
				return r.e.pause(ctx, stage, name, err.Error()+"; the node stays cordoned", actionTalosAccess, err)
			case err != nil:
				// Going down already, or a reboot under way: the boot ID says.
				r.e.node(stage, name, PhaseUpgrading, "reboot: %s: following the node", stages.FirstLine(err))
			}

			return r.follow(ctx, n, mark, out)
		case actWait:
			if time.Now().After(deadline) {
				err := fmt.Errorf("node %q: an install started in boot %s and has not ended after %s (machined's log)", name, shortID(mark.BootID), r.opts.UpgradeTimeout+r.opts.RebootTimeout)
				if lost == lostDeadline {
					err = fmt.Errorf("node %q: the Install call ran out its bound of %s and the install it started in boot %s has not ended after %s (machined's log): "+
						"an install may be pending", name, r.opts.UpgradeTimeout, shortID(mark.BootID), r.opts.UpgradeTimeout+r.opts.RebootTimeout)
				}

				return r.e.pause(ctx, stage, name, err.Error()+"; the node stays cordoned",
					fmt.Sprintf("look at it (talosctl -n %s logs machined | grep upgrade): once it says upgrade completed, resume (kubectl ichor resume) to reboot it", ip), err)
			}

			r.e.node(stage, name, PhaseUpgrading, "an install runs on the node (machined's log): waiting for it to end")

			if err := sleep(ctx, max(r.poll, time.Second)); err != nil {
				return fmt.Errorf("stage %s: node %q: %w", stage, name, err)
			}
		case actUnread:
			if unreadSince.IsZero() {
				unreadSince = time.Now()
			}

			if waited := time.Since(unreadSince); waited >= r.opts.UpgradeTimeout {
				err := fmt.Errorf("node %q: its machined log could not be read within %s (%s): whether an install ran in boot %s is not known",
					name, r.opts.UpgradeTimeout, stages.FirstLine(seen.evidenceErr), shortID(mark.BootID))

				return r.e.pause(ctx, stage, name, err.Error()+"; the node stays cordoned",
					fmt.Sprintf("look at it (talosctl -n %s logs machined | grep upgrade): resume (kubectl ichor resume) once the log answers; "+
						"a second install in this boot would overwrite the running boot slot", ip), err)
			}

			r.e.node(stage, name, PhaseUpgrading, "machined's log: %s: reading it again", stages.FirstLine(seen.evidenceErr))

			if err := sleep(ctx, max(r.poll, time.Second)); err != nil {
				return fmt.Errorf("stage %s: node %q: %w", stage, name, err)
			}
		case actForeign:
			return r.foreignPause(ctx, n, seen.evidence, installer)
		case actPause:
			err := fmt.Errorf("node %q: its upgrade was announced in boot %s, which it still runs, and its machined log no longer reaches back to say whether the install ran", name, shortID(mark.BootID))

			return r.e.pause(ctx, stage, name, err.Error()+"; the node stays cordoned",
				fmt.Sprintf("look at it (talosctl -n %s logs machined; talosctl -n %s dmesg | grep upgrade): if the install completed, reboot it (talosctl -n %s reboot), "+
					"then resume (kubectl ichor resume); a second install would overwrite the running boot slot", ip, ip, ip), err)
		case actInstall:
			attempts++
			if attempts > installAttempts {
				err := fmt.Errorf("node %q: %d Install calls in boot %s broke off and the node says none ran", name, installAttempts, shortID(mark.BootID))

				return r.e.pause(ctx, stage, name, err.Error()+"; the node stays cordoned", actionTalosAccess, err)
			}

			// A drain under way (out.drain) is this run's, of a moment ago: it is
			// joined before the reboot, a node made schedulable meanwhile drained
			// again then.
			if out.drain == nil {
				if err := r.ensureDrained(ctx, n, r.ownPod(name, orUnknown(mark.From))); err != nil {
					return err
				}
			}

			if installer == "" {
				choice, err := r.installer(ctx, n.Node, n.cfg)
				if err != nil {
					return r.e.pause(ctx, stage, name, "checks: "+err.Error(), installerAction([]string{name}, r.target), err)
				}

				installer = choice.Image
				if mark.Expect == nil && !choice.Expect.Empty() {
					mark.Expect = &choice.Expect
				}
			}

			if err := r.gateBefore(ctx, n, momentInstall); err != nil {
				return err
			}

			mark.Step = stepInstall
			if mark.From == "" && seenVersion != "?" {
				mark.From = seenVersion
			}

			if err := r.writeMark(ctx, name, mark); err != nil {
				return err
			}

			from := orUnknown(out.from)
			if from == "unknown" {
				from = seenVersion
			}

			r.e.node(stage, name, PhaseUpgrading, "upgrading Talos %s -> %s with %s (install announced in boot %s; bound %s)",
				from, r.target, installer, shortID(mark.BootID), r.opts.UpgradeTimeout)

			callCtx, cancel := context.WithTimeout(ctx, r.opts.UpgradeTimeout)
			rebooting, err := r.e.Talos.Install(callCtx, ip, installer)
			ranOut := callCtx.Err() != nil

			cancel()

			switch {
			case ctx.Err() != nil:
				// Stopped mid-call: the mark announces the install; the next run
				// asks the node what it did.
				return fmt.Errorf("stage %s: node %q: upgrade: %w", stage, name, ctx.Err())
			case err == nil && rebooting:
				mark.Step, mark.Legacy = stepReboot, true
				if err := r.writeMark(ctx, name, mark); err != nil {
					return err
				}

				r.e.node(stage, name, PhaseUpgrading, "Upgrade call done: waiting for the reboot into %s (bound %s)", r.target, r.opts.RebootTimeout)

				return r.follow(ctx, n, mark, out)
			case err == nil:
				mark.Step = stepInstalled
				if err := r.writeMark(ctx, name, mark); err != nil {
					return err
				}

				act, look = actReboot, false
			case talos.IsInstallInProgress(err):
				act, look = actWait, false
			case ranOut || deadlineError(err):
				// Talos runs the installer to its end whether its caller waits or
				// not: the install may still run, or have ended, on the node.
				lost = lostDeadline
				r.e.node(stage, name, PhaseUpgrading, "the Install call ran out its bound of %s (%s): the installer may still run on the node: asking it what it did",
					r.opts.UpgradeTimeout, stages.FirstLine(err))
			case transientInstallError(err):
				// The answer lost: the install (the legacy call's sequence) may run
				// all the same; machined's log says (the mark keeps stepInstall
				// until it does).
				lost = lostStream
				r.e.node(stage, name, PhaseUpgrading, "the Install call broke off (%s): asking the node what it did", stages.FirstLine(err))
			case strings.Contains(err.Error(), talosEtcdRefusal):
				// MachineService.Upgrade's own etcd checks (Talos before 1.13),
				// made after ichor's: etcd changed in between.
				return r.undo(ctx, name, fmt.Errorf("node %q: upgrade to %s: %w", name, installer, err),
					fmt.Sprintf("nothing was rebooted: Talos' own etcd checks refused the upgrade; look at etcd (talosctl -n %s etcd status; talosctl -n %s etcd members), then resume", ip, ip))
			default:
				return r.undo(ctx, name, fmt.Errorf("node %q: upgrade to %s: %w", name, installer, err),
					"nothing was rebooted: check the installer image is reachable from the node (talosctl -n "+ip+" image pull "+installer+
						"), then resume")
			}
		}
	}
}

// pendingPause pauses a node whose Install call ran out its bound and
// whose machined log does not say the chosen install completed (nothing
// started, it failed, or the log does not reach back): the node stays
// cordoned, as an install may still be pending on it.
func (r *talosRun) pendingPause(ctx context.Context, n *osNode, seen nodeSeen) error {
	name, ip := n.Name, n.InternalIP

	err := fmt.Errorf("node %q: the Install call ran out its bound of %s and machined's log says: %s; an install may be pending on the node",
		name, r.opts.UpgradeTimeout, seen.evidence)

	return r.e.pause(ctx, r.stage.Name(), name, err.Error()+"; the node stays cordoned",
		fmt.Sprintf("look at it (talosctl -n %s logs machined | grep upgrade), then resume (kubectl ichor resume: it asks the node again, "+
			"reboots it if the install completed and installs only if none ran), or abort (kubectl ichor abort uncordons it; "+
			"an install that completes boots at the node's next reboot: talosctl -n %s rollback drops it)", ip, ip), err)
}

// deadlineError reports whether err, from an Install call, is a deadline or
// a cancellation (the client's bound, or the server's) rather than an answer.
func deadlineError(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}

	switch client.StatusCode(err) {
	case codes.DeadlineExceeded, codes.Canceled:
		return true
	}

	return false
}

// errSameBoot is follow finding the node up in the boot its install was
// announced in, with no reboot asked: the run decides again.
var errSameBoot = errors.New("the node answers in the boot its install was announced in")

// ensureDrained cordons and drains a node whose upgrade is under way when
// ichor's cordon is no longer on it, or its mark is but the node is
// schedulable (uncordoned after a pause), before it is installed.
func (r *talosRun) ensureDrained(ctx context.Context, n *osNode, own ownPod) error {
	if r.cordonedByUs(ctx, n.Name) {
		return nil
	}

	_, err := r.e.cordonAndDrain(ctx, r.opts, r.stage.Name(), n.Name, own, "")

	return err
}

// drainLeft makes sure, right before a node's reboot, that it is cordoned and
// that no pod is left on it to evict: on the runner's own node, the runner's pod,
// which stayed through the drain and the install (ownPodUntilReboot) and now
// hands over to its successor, or is evicted; on another, a runner that handed
// over there and has not ended yet, or a pod that came since the drain (one that
// tolerates the cordon, or bound to the node by name). A pod that ended is not
// waited for (kube.Drainer.Left). A node drained and left alone costs one list
// of its pods.
// The install is made by then: a pause of either drain says it stays for the
// node's next boot.
func (r *talosRun) drainLeft(ctx context.Context, n *osNode) error {
	stage, name := r.stage.Name(), n.Name
	kept := r.installKept()

	if !r.cordonedByUs(ctx, name) {
		_, err := r.e.cordonAndDrain(ctx, r.opts, stage, name, ownPodByStage, kept)

		return err
	}

	keep := ""
	if r.opts.StayOnNode {
		keep = r.opts.SelfPod
	}

	left, stopping, err := kube.Drainer{Client: r.e.Kube, Keep: keep, Timeout: r.opts.DrainTimeout}.Left(ctx, name)
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("stage %s: node %q: %w", stage, name, ctx.Err())
	case err == nil && left == 0:
		return nil
	case err == nil && stopping == left:
		// Evicted by an earlier run's drain (stopped before it joined it), their
		// grace periods running.
		r.e.node(stage, name, PhaseDraining, "%d evicted pod(s) still stopping: waiting for them before its reboot", left)
	case err == nil && name != r.opts.Self:
		r.e.node(stage, name, PhaseDraining, "%d pod(s) on it since its drain: draining it again before its reboot", left)
	}

	// Pods left, or a list that failed (a pod the drain cannot evict either,
	// the API slow past the bound): the drain again, whose failure pauses
	// saying what to do.
	_, err = r.e.cordonAndDrain(ctx, r.opts, stage, name, ownPodByStage, kept)

	return err
}

// installKept says what a pause between a node's install and its reboot
// leaves on it, for the pause's reason.
func (r *talosRun) installKept() string {
	return fmt.Sprintf("Talos %s stays installed for its next boot", r.target)
}

// cordonedByUs reports whether the node carries ichor's cordon and is
// unschedulable, on the watch once it shows what the run last wrote to or read
// of the Node (kube.Nodes.Get): a cordon the run made a moment ago counts.
func (r *talosRun) cordonedByUs(ctx context.Context, name string) bool {
	node, err := r.e.nodes.Get(ctx, name)

	return err == nil && kube.CordonOf(node) == kube.CordonedByUs
}

// ownPod is what the drains of n, which runs version, do with the runner's own
// pod when n is the runner's node: on a Talos with the lifecycle service (1.13 and
// later), whose install leaves the node's pods running, the runner stays through
// the drain and the install and hands over right before the reboot (drainLeft), its
// successor asked for at the drain and started by then. On an older Talos the one
// MachineService.Upgrade call installs and reboots: the runner leaves at the drain.
// A version not known counts as older.
func (r *talosRun) ownPod(name, version string) ownPod {
	if name != r.opts.Self {
		return ownPodByStage
	}

	if !lifecycleInstall(version) {
		return ownPodByStage
	}

	return ownPodUntilReboot
}

// lifecycleInstall reports whether a node running version installs with
// LifecycleService.Upgrade, which leaves the node's pods running and does not
// reboot (1.13 and later). A version not known counts as older. (Should such a
// node answer Unimplemented, talos.Client.Install falls back to the one
// MachineService.Upgrade call, whose own sequence cordons and drains the node,
// waiting for its pods, before it reboots.)
func lifecycleInstall(version string) bool {
	v, err := stages.ParseVersion(version)

	return err == nil && v.Compare(lifecycleSince) >= 0
}

// lifecycleSince is the first Talos with LifecycleService.Upgrade.
var lifecycleSince = stages.MustParseVersion("v1.13.0")

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
