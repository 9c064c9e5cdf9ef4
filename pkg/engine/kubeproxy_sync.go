package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// This file is the KubeProxy stage's end: the sync of the bootstrap manifests once Talos
// has re-rendered them for the target (the rollout that follows: kubeproxy_rollout.go).

// syncManifests server-side applies the bootstrap manifests of a control
// plane whose config runs kube-proxy at the target, once the invariant
// allows kube-proxy at the target everywhere. It reports whether it synced.
// A kube-proxy DaemonSet the sync skips pauses the stage at once: its rollout
// cannot come.
func (r *kubeRun) syncManifests(ctx context.Context, stage string, sn *stageNode, res *render.Result) (bool, error) {
	image, ok := render.Images(res.Config)[discovery.KubeProxy]
	if !ok || render.TagOf(image) != r.target.String() {
		return false, nil
	}

	if err := r.predictKubeProxy(ctx, stage, sn.Name); err != nil {
		return false, err
	}

	objs, err := r.renderedManifests(ctx, stage, sn)
	if err != nil {
		return false, err
	}

	res2, err := r.applier.Sync(ctx, objs, kube.SyncOptions{Force: r.opts.ManifestsForce})
	if err != nil {
		reason := fmt.Sprintf("node %q: sync bootstrap manifests (%d of %d applied, nothing after): %v", sn.Name, len(res2.Applied), len(objs), err)

		return false, r.pause(ctx, stage, sn.Name, reason, syncAction(err, sn.InternalIP), errors.New(reason))
	}

	for _, sk := range res2.Skipped {
		r.e.node(stage, sn.Name, PhaseVerifying, "bootstrap manifests: skipped %s: another field manager owns fields the sync would take over (%s); "+
			"to take them over, upgrade with --manifests-force %q", sk.Object, sk.Conflict, sk.Object)
	}

	r.e.stepTime(stage, StepManifests, StepTiming{Done: true})
	r.e.step(stage, StepManifests, "%s", syncMessage(res2, sn.Name))

	if sk, skipped := skippedKubeProxy(res2.Skipped); skipped {
		reason := fmt.Sprintf("node %q: bootstrap manifests: %s skipped: %s holds fields the sync would change, so kube-proxy cannot reach %s (%s)",
			sn.Name, stages.KubeProxyObject, holdersText(sk), r.target, sk.Conflict)

		return false, r.pause(ctx, stage, sn.Name, reason, KubeProxyForceAction(r.target), errors.New(reason))
	}

	return true, nil
}

// KubeProxyForceAction is what to do when another field manager holds fields of the
// kube-proxy DaemonSet that the sync would change: force it over, in a new operation
// (the finished nodes are only verified).
func KubeProxyForceAction(target stages.Version) string {
	return fmt.Sprintf("to let the sync take the DaemonSet back for Talos: kubectl ichor abort, then kubectl ichor upgrade kubernetes --to %s --manifests-force %q "+
		"(the nodes already done are only verified)", target, stages.KubeProxyObject)
}

// syncMessage says what a sync did, on one line.
func syncMessage(res *kube.SyncResult, node string) string {
	msg := fmt.Sprintf("applied %d bootstrap manifest object(s) from %s (field manager %s, nothing pruned)", len(res.Applied), node, kube.FieldManager)

	if len(res.TakenOver) > 0 {
		names := make([]string, 0, len(res.TakenOver))
		for _, t := range res.TakenOver {
			names = append(names, fmt.Sprintf("%s (from %s)", t.Object, holdersList(t.From)))
		}

		msg += fmt.Sprintf("; took over %d from Talos' own earlier writes: %s", len(names), text.Summarize(names))
	}

	if res.Inventory > 0 {
		msg += fmt.Sprintf("; %d recorded in Talos' inventory", res.Inventory)
	}

	if len(res.Skipped) > 0 {
		names := make([]string, 0, len(res.Skipped))
		for _, sk := range res.Skipped {
			names = append(names, sk.Object)
		}

		msg += fmt.Sprintf("; skipped %d changed by another field manager: %s", len(names), text.Summarize(names))
	}

	return msg
}

// skippedKubeProxy returns the kube-proxy DaemonSet among skipped.
func skippedKubeProxy(skipped []kube.Skipped) (kube.Skipped, bool) {
	for _, sk := range skipped {
		if sk.Object == stages.KubeProxyObject {
			return sk, true
		}
	}

	return kube.Skipped{}, false
}

// holdersText names the holders of a skipped object: `field manager "helm" (Update)`.
func holdersText(sk kube.Skipped) string {
	switch len(sk.Holders) {
	case 0:
		return "another field manager"
	case 1:
		return "field manager " + sk.Holders[0].String()
	}

	return "field managers " + holdersList(sk.Holders)
}

func holdersList(holders []kube.Holder) string {
	parts := make([]string, 0, len(holders))
	for _, h := range holders {
		parts = append(parts, h.String())
	}

	return strings.Join(parts, ", ")
}

// syncAction says what to do about the object a manifest sync stopped at (err names it).
// The Job's access to the manifests' objects is computed from them when the operation is
// launched or resumed, so a kind the cluster serves by the resume is covered then.
func syncAction(err error, ip string) string {
	fix := fmt.Sprintf("or take it out of the machine config's inline or extra manifests (talosctl -n %s get manifests)", ip)

	switch {
	case meta.IsNoMatchError(err):
		return "the cluster does not serve the object's kind: install its CustomResourceDefinition (resume grants the Job access to the object), " +
			fix + ", then resume"
	case apierrors.IsForbidden(err):
		return "the Job may not write the object (its access is computed from the manifests at launch and on resume; an admission policy may refuse it too): " +
			"apply it yourself as a cluster admin, lift the policy, " + fix + ", then resume"
	default:
		return "the apiserver refuses the object (its validation or an admission policy, as the error says): fix the object or lift the policy, " +
			fix + ", then resume"
	}
}

// renderedManifests reads node's bootstrap manifests once Talos has re-rendered them
// for the target (it does so asynchronously after the apply): the kube-proxy
// DaemonSet's image at the target, waiting at most RenderTimeout.
func (r *kubeRun) renderedManifests(ctx context.Context, stage string, sn *stageNode) ([]*unstructured.Unstructured, error) {
	wctx, cancel := context.WithTimeout(ctx, r.opts.RenderTimeout)
	defer cancel()

	var (
		seen string
		last error
	)

	for {
		readCtx, cancelRead := context.WithTimeout(wctx, talosReadTimeout)
		objs, err := r.e.Talos.Manifests(readCtx, sn.InternalIP)

		cancelRead()

		if err == nil {
			seen = kubeProxyImage(objs)
			if render.TagOf(seen) == r.target.String() {
				return objs, nil
			}
		}

		last = err

		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, fmt.Errorf("read bootstrap manifests: %w", ctx.Err())
			}

			if last != nil {
				err := fmt.Errorf("node %q: read bootstrap manifests: %w", sn.Name, last)

				return nil, r.pause(ctx, stage, sn.Name, err.Error(), actionTalosAccess, err)
			}

			err := fmt.Errorf("node %q: Talos has not re-rendered the bootstrap manifests for %s after %s (kube-proxy image %s)",
				sn.Name, r.target, r.opts.RenderTimeout, orUnknownTag(seen))

			return nil, r.pause(ctx, stage, sn.Name, err.Error(),
				fmt.Sprintf("check the node's manifests (talosctl -n %s get manifests) and its controller logs (talosctl -n %s logs controller-runtime), then resume",
					sn.InternalIP, sn.InternalIP), err)
		case <-time.After(time.Second):
		}
	}
}

// kubeProxyImage is the kube-proxy container's image of the kube-proxy DaemonSet among
// objs, "" when there is none.
func kubeProxyImage(objs []*unstructured.Unstructured) string {
	for _, obj := range objs {
		if !stages.IsKubeProxy(obj) {
			continue
		}

		containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			m, _ := c.(map[string]any)
			if m["name"] == discovery.KubeProxyDaemonSet {
				image, _ := m["image"].(string)

				return image
			}
		}
	}

	return ""
}
