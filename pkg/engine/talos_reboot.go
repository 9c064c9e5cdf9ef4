package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file follows a node's reboot after its install, by its boot ID (unreachable is
// rebooting, the same ID is not yet, a new ID on the old version is an A/B fallback),
// then verifies it: Node Ready on the new osImage, etcd all voters on a control plane,
// what its installer was to carry; then uncordons it.

// follow waits, bounded by RebootTimeout, for the node to reboot out of the
// boot mark recorded and come back on the target, then verifies it. A node
// that comes back on another version fell back to its previous A/B slot:
// that pauses.
func (r *talosRun) follow(ctx context.Context, n *osNode, mark upgradeMark, out outcome) error {
	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP
	start := time.Now()
	deadline := start.Add(r.opts.RebootTimeout)

	if n.ControlPlane {
		defer r.etcdWhileDown(ctx, name)()
	}

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

	// On a control plane its etcd member is looked at while the Node comes Ready, not
	// after: the two come back independently (etcd is Talos', the Node the kubelet's).
	var rejoined chan etcdRejoin

	if n.ControlPlane {
		etcdCtx, cancel := context.WithCancel(ctx)
		defer cancel()

		rejoined = make(chan etcdRejoin, 1)

		go func() { rejoined <- r.etcdRejoined(etcdCtx, name, deadline, bound, report) }()
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
		res := <-rejoined

		switch {
		case errors.As(res.err, &timeout):
			return r.e.pause(ctx, stage, name,
				fmt.Sprintf("verify: %s after %s; the node stays cordoned if ichor cordoned it", timeout.Waiting, bound),
				res.verdict.LookAction("resume (kubectl ichor resume)"), fmt.Errorf("node %q: verify etcd: %w", name, res.err))
		case res.err != nil:
			return r.e.pause(ctx, stage, name, "verify etcd: "+res.err.Error(), actionResume, fmt.Errorf("node %q: verify etcd: %w", name, res.err))
		}

		etcd = fmt.Sprintf("etcd member healthy, %d of %d voter(s) healthy", res.verdict.Left, res.verdict.Voters)
	}

	if err := r.checkCarried(ctx, n, deadline, bound, report); err != nil {
		return err
	}

	uncordoned := false

	if node, ok := r.cache.Node(name); ok && kube.CordonedByIchor(node) {
		if err := r.e.nodes.Uncordon(ctx, name); err != nil {
			return r.e.pause(ctx, stage, name, err.Error(), actionResume, err)
		}

		uncordoned = true
	}

	r.e.node(stage, name, PhaseDone, "%s", out.describe(r.target, osImage, etcd, uncordoned))

	return nil
}

// etcdWhileDown reads, while control plane name reboots and until the
// returned stop is called (its verify ended), a pass of the other members'
// statuses every gap (stages.EtcdChain.PassEvery): the read at its return then
// judges its member in one pass, on what the leader had committed a gap or
// two before, not two passes a gap apart. Each pass's calls are bounded.
func (r *talosRun) etcdWhileDown(ctx context.Context, name string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})

	go func() {
		defer close(done)

		r.etcd.PassEvery(ctx, name)
	}()

	return func() {
		cancel()
		<-done
	}
}

// etcdRejoin is what etcdRejoined found.
type etcdRejoin struct {
	verdict stages.EtcdVerdict
	err     error
}

// etcdRejoined waits until deadline (bound is its length, for messages) for
// the control plane's etcd member to be back: healthy, keeping up, with a
// quorum of healthy voters (EtcdVerdict.Rejoined).
func (r *talosRun) etcdRejoined(ctx context.Context, name string, deadline time.Time, bound time.Duration, report func(string)) etcdRejoin {
	var verdict stages.EtcdVerdict

	// ReadEtcd bounds each of its calls; it reads several in turn, so it gets
	// ctx, not the poll's short one. The first look takes a view of the last
	// second (the node before it was verified on it, or a resumed run's node
	// before it): only a member that rejoined passes; the next looks read anew.
	look := r.lookEtcd

	err := r.pollUntil(ctx, deadline, bound, func(context.Context) (bool, string, error) {
		verdict = look(ctx).Judge("")
		look = r.readEtcd

		if waiting := verdict.Rejoined(name); waiting != "" {
			return false, "etcd: " + waiting, nil
		}

		return true, "", nil
	}, report)

	return etcdRejoin{verdict: verdict, err: err}
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

// talosOSImage is the osImage a Node on Talos version v reports.
func talosOSImage(v stages.Version) string {
	return fmt.Sprintf("Talos (%s)", v)
}
