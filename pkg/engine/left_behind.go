package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// A node that registers after a run's stages read the cluster (a worker
// joining, a machine powered on mid-upgrade) is among no stage's nodes. Each
// upgrade ends with a last look at the Nodes: one that is not held and still
// behind the target pauses the run, naming it, rather than a Succeeded that
// leaves it behind; the next run (a resume) takes it as any node behind.

// behindFunc says of node n, not held, what it runs ("kubelet v1.35.4") and
// whether that is behind the run's target. A version it cannot read is not
// behind: that was the stages' to refuse, and is the next run's.
type behindFunc func(ctx context.Context, n discovery.Node) (runs string, behind bool)

// leftBehind is a run's last look at the cluster: it takes the Nodes and
// pauses stage naming those not held that behind says are behind target;
// next says what the next run does with them. The Nodes are the run's watch's:
// the one its verifications waited on, so a node the run moved shows where it
// moved it, and a node that registered a moment before the watch saw it is one
// that joined a moment later, the next run's as it would be.
func (e *Engine) leftBehind(ctx context.Context, stage string, target stages.Version, behind behindFunc, next string) error {
	type left struct{ name, line string }

	var found []left

	for _, node := range e.nodes.List() {
		n := discovery.NodeFrom(node)
		if n.Held {
			continue
		}

		if runs, ok := behind(ctx, n); ok {
			found = append(found, left{name: n.Name, line: fmt.Sprintf("%s (%s)", n.Name, runs)})
		}
	}

	if len(found) == 0 {
		return nil
	}

	slices.SortFunc(found, func(a, b left) int { return strings.Compare(a.name, b.name) })

	lines := make([]string, 0, len(found))
	for _, l := range found {
		lines = append(lines, l.line)
	}

	reason := fmt.Sprintf("%s joined after the stages had read the cluster: behind the target %s", text.Summarize(lines), target)

	return e.pause(ctx, stage, found[0].name, reason,
		"let it finish joining (kubectl get node), then resume (kubectl ichor resume): "+next, errors.New(reason))
}

// kubeletBehind is the Kubernetes upgrade's behindFunc: the Node's kubelet
// older than the target.
func kubeletBehind(target stages.Version) behindFunc {
	return func(_ context.Context, n discovery.Node) (string, bool) {
		v, err := stages.ParseVersion(n.KubeletVersion)

		return "kubelet " + n.KubeletVersion, err == nil && v.Compare(target) < 0
	}
}

// talosBehind is the Talos upgrade's behindFunc. The Node's osImage names
// the Talos it booted; when that is older than the target, the node's Talos
// API decides, as it does for a visit (a node that answers the target is on
// it, its Node not updated yet). A node whose API does not answer within a
// short look, or answers what does not parse, is behind by its osImage.
func (r *talosRun) talosBehind(ctx context.Context, n discovery.Node) (string, bool) {
	booted, ok := strings.CutPrefix(n.OSImage, "Talos (")
	if !ok {
		return "", false // not Talos: the next run refuses it, as the stage did
	}

	booted = strings.TrimSuffix(booted, ")")

	v, err := stages.ParseVersion(booted)
	if err != nil || v.Compare(r.target) >= 0 {
		return "", false
	}

	runs := "Talos " + booted

	if n.InternalIP == "" {
		return runs, true
	}

	ctx, cancel := context.WithTimeout(ctx, talosPollCallTimeout)
	defer cancel()

	version, err := r.e.Talos.Version(ctx, n.InternalIP)
	if err != nil {
		return runs, true
	}

	if v, err := stages.ParseVersion(version); err == nil {
		if v.Compare(r.target) >= 0 {
			return "", false
		}

		runs = "Talos " + version
	}

	return runs, true
}
