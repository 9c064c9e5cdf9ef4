package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// This file is what gates the Talos upgrade's first install: per node the upgrade path,
// readiness, installer and staged config; for the cluster the Kubernetes pairing of the
// target (machinery's compatibility tables) and etcd.

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
		return r.refuse(ctx, pathNodes, "upgrade path: "+text.Summarize(path),
			"upgrade through an intermediate Talos release first (see the Talos upgrade notes), or hold the nodes")
	case len(unsupported) > 0:
		return r.refuse(ctx, nil, fmt.Sprintf("Talos %s does not support the Kubernetes the cluster runs: %s", r.target, text.Summarize(unsupported)),
			"move Kubernetes into the range the target supports first (kubectl ichor plan kubernetes --to ...)")
	case len(installers) > 0:
		return r.refuse(ctx, installerNodes, "installer: "+text.Summarize(installers),
			installerAction(installerNodes, r.target))
	case len(staged) > 0:
		ip := ""
		if n := r.pendingNode(pending, stagedNodes[0]); n != nil {
			ip = n.InternalIP
		}

		return r.refuse(ctx, stagedNodes, "a machine config change is staged for the next reboot, which the upgrade's would activate: "+text.Summarize(staged),
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
