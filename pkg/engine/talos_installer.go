package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// The installer of each node, in the run: chosen by ChooseInstaller from
// what the node runs (read from its Talos at each decision, never
// remembered), pulled on the node before its batch's first cordon (a
// missing or unreachable image drains nothing), and, after the reboot,
// checked against what the node came back with (a node that lost its
// schematic or an extension pauses, cordoned).

// installer returns the installer a node with active config cfg is
// upgraded with: ChooseInstaller over what the node runs, read from its
// Talos now (its extensions and schematic are what it booted with).
func (r *talosRun) installer(ctx context.Context, n discovery.Node, cfg config.Provider) (stages.Installer, error) {
	configured := ""
	if cfg != nil {
		configured = discovery.InstallImage(cfg)
	} else if n.Talos != nil {
		configured = n.Talos.InstallImage
	}

	var installed talos.Installed

	err := r.e.whileUnreachable(ctx, r.opts.UnreachableGrace, n.Name, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
		defer cancel()

		var err error

		installed, err = r.e.Talos.Installed(ctx, n.InternalIP)

		return err
	})
	if err != nil {
		return stages.Installer{}, fmt.Errorf("node %q: read its system extensions: %w", n.Name, err)
	}

	return stages.ChooseInstaller(n.Name, configured, &installed, r.stage.Installers, r.target)
}

// installerAction is what to do when a node's installer cannot be chosen
// or pulled while the operation runs: resume takes no --installer-image, so
// the operation is ended and started again with one.
func installerAction(nodes []string, target stages.Version) string {
	node := "NODE"
	if len(nodes) == 1 {
		node = nodes[0]
	}

	return fmt.Sprintf("kubectl ichor abort, then kubectl ichor upgrade talos --to %s --installer-image %s=<installer that keeps what it runs>:%s", target, node, target)
}

// prePull pulls, on every node of a group that is to be installed, its
// installer into Talos' system namespace (ImageService.Pull, or
// MachineService.ImagePull on a Talos before 1.13), PullConcurrency nodes
// at once, each under PullTimeout, before the group's first cordon: a pull
// that fails pauses the run with nothing of the group cordoned or drained.
// A node whose
// Talos can do neither is said and skipped: MachineService.Upgrade, its
// only upgrade call, pulls and checks the installer itself before it
// installs anything. Nodes whose upgrade is under way, or that run the
// target already, are not installed again by this run and are left out.
func (r *talosRun) prePull(ctx context.Context, group []*osNode) error {
	todo, images, errs, stopped := r.pullGroup(ctx, group)
	if stopped != nil {
		return r.e.pause(ctx, r.stage.Name(), "", "", "", stopped)
	}

	for i, err := range errs {
		switch {
		case err == nil:
		case isPullError(err):
			return r.pullPause(ctx, todo[i], images[i], err)
		default:
			return r.e.pause(ctx, r.stage.Name(), todo[i].Name, "checks: "+err.Error()+"; nothing was cordoned", installerAction([]string{todo[i].Name}, r.target), err)
		}
	}

	return nil
}

// pullGroup chooses, on every node of group that is to be installed, its installer
// (read from the node now) and pulls it there, PullConcurrency nodes at once; an
// installer this run pulled on the node already is not pulled again. It returns the
// nodes it chose for, with each one's installer and outcome (worded for its pause),
// and ForEach's own error, which only says that ctx ended before every node started.
func (r *talosRun) pullGroup(ctx context.Context, group []*osNode) (todo []*osNode, images []string, errs []error, stopped error) {
	for _, n := range group {
		if r.mark(n.Name).following() || n.unreachable != nil || n.version == r.target.String() {
			continue
		}

		todo = append(todo, n)
	}

	if len(todo) == 0 {
		return nil, nil, nil, nil
	}

	errs = make([]error, len(todo))
	images = make([]string, len(todo))
	// Each node's outcome goes to its place in todo.
	places := make([]int, len(todo))
	for i := range places {
		places[i] = i
	}

	nameOf := func(i int) string { return todo[i].Name }

	stopped = talos.ForEach(ctx, places, nameOf, r.opts.PullConcurrency, func(ctx context.Context, i int) error {
		n := todo[i]

		choice, err := r.installer(ctx, n.Node, n.cfg)
		if err != nil {
			errs[i] = err

			return nil
		}

		images[i] = choice.Image
		if n.pulled != choice.Image {
			errs[i] = r.pull(ctx, n, choice.Image)
		}

		return nil
	})

	return todo, images, errs, stopped
}

// pullAhead pulls the installers of group, the next group to be upgraded, in the
// background while the group before it is upgraded. On a real cluster an installer
// takes a while to pull and a reboot takes minutes, so the next group's pull is off
// the critical path. It changes nothing but the nodes' image caches and decides
// nothing: the group's own prePull, at its turn, chooses each installer again from
// what its node runs then, pulls what was not pulled (or failed here, or changed
// since) and pauses on a failure, nothing of the group cordoned, as before.
func (r *talosRun) pullAhead(ctx context.Context, group []*osNode) *pullingAhead {
	return startPullAhead(ctx, func(ctx context.Context) { _, _, _, _ = r.pullGroup(ctx, group) })
}

// pullError is a pull of a node's installer that failed.
type pullError struct{ error }

func (e *pullError) Unwrap() error { return e.error }

func isPullError(err error) bool {
	var p *pullError

	return errors.As(err, &p)
}

// pull pulls image on node n (see prePull) and records it pulled; a Talos
// that cannot pre-pull is said and recorded so.
func (r *talosRun) pull(ctx context.Context, n *osNode, image string) error {
	r.e.node(r.stage.Name(), n.Name, PhasePending, "pulling its installer %s (bound %s)", image, r.opts.PullTimeout)

	pullCtx, cancel := context.WithTimeout(ctx, r.opts.PullTimeout)
	err := r.e.Talos.PullImage(pullCtx, n.InternalIP, talos.NamespaceSystem, image)

	cancel()

	switch {
	case errors.Is(err, talos.ErrPullUnsupported):
		r.e.node(r.stage.Name(), n.Name, PhasePending,
			"its Talos cannot pre-pull (no ImageService, no MachineService.ImagePull): its Upgrade call pulls and checks %s before it installs anything", image)
	case err != nil:
		return &pullError{fmt.Errorf("node %q: pull its installer %s: %w", n.Name, image, err)}
	default:
		r.e.node(r.stage.Name(), n.Name, PhasePending, "installer %s pulled", image)
	}

	n.pulled = image

	return nil
}

// pullPause pauses for an installer that did not pull, nothing of the
// group cordoned.
func (r *talosRun) pullPause(ctx context.Context, n *osNode, image string, err error) error {
	if ctx.Err() != nil {
		return r.e.pause(ctx, r.stage.Name(), n.Name, "", "", err)
	}

	return r.e.pause(ctx, r.stage.Name(), n.Name,
		fmt.Sprintf("pre-pull: %s; nothing was cordoned or drained", stages.FirstLine(err)),
		fmt.Sprintf("make %s reachable from the node (registry, mirrors: talosctl -n %s image pull %s), then resume (kubectl ichor resume); "+
			"or pass another: %s", image, n.InternalIP, image, installerAction([]string{n.Name}, r.target)),
		err)
}

// ensurePulled pulls a node's installer before its cordon when its batch's
// pre-pull did not (the node was unreachable then, or its installer changed
// since).
func (r *talosRun) ensurePulled(ctx context.Context, n *osNode, image string) error {
	if n.pulled == image {
		return nil
	}

	if err := r.pull(ctx, n, image); err != nil {
		return r.pullPause(ctx, n, image, err)
	}

	return nil
}

// checkCarried compares, after a node's reboot into the target, what it
// runs (its ExtensionStatus resources, its schematic) with what its
// installer was to carry, as its mark recorded before the install: a node
// that came back without them pauses, cordoned, naming what is missing.
// Verification by Ready and osImage alone would pass a node rebooted
// without its storage or GPU drivers.
func (r *talosRun) checkCarried(ctx context.Context, n *osNode, deadline time.Time, bound time.Duration, report func(string)) error {
	mark := r.mark(n.Name)
	if mark == nil || mark.Expect == nil || mark.Expect.Empty() {
		return nil
	}

	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP

	var runs talos.Installed

	err := r.pollUntil(ctx, deadline, bound, func(ctx context.Context) (bool, string, error) {
		var err error

		runs, err = r.e.Talos.Installed(ctx, ip)

		switch {
		case talos.IsPermissionDenied(err):
			return false, "", err
		case err != nil:
			return false, "reading its extensions: " + stages.FirstLine(err), nil
		}

		return true, "", nil
	}, report)

	var timeout *kube.WaitTimeoutError

	switch {
	case errors.As(err, &timeout):
		return r.e.pause(ctx, stage, name, fmt.Sprintf("verify: %s after %s; the node stays cordoned if ichor cordoned it", timeout.Waiting, bound),
			verifyAction(name), fmt.Errorf("node %q: verify extensions: %w", name, err))
	case err != nil:
		return r.e.pause(ctx, stage, name, "verify extensions: "+err.Error(), actionTalosAccess, fmt.Errorf("node %q: verify extensions: %w", name, err))
	}

	missing := mark.Expect.Missing(runs)
	if len(missing) == 0 {
		return nil
	}

	err = fmt.Errorf("node %q came back on Talos %s without what its installer was to carry: %s", name, r.target, strings.Join(missing, ", "))

	return r.e.pause(ctx, stage, name, err.Error()+"; the node stays cordoned",
		fmt.Sprintf("look at what it runs (talosctl -n %s get extensions); install an installer that carries it (talosctl -n %s upgrade --image <installer>:%s), "+
			"then resume (kubectl ichor resume) to verify it again; or, to keep the node as it runs, kubectl ichor abort (it uncordons the node)", ip, ip, r.target),
		err)
}
