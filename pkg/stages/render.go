package stages

import (
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// This file is what a Kubernetes stage's render gives a node: its machine config
// (RenderStage), and, for the KubeProxy stage, the bootstrap manifests Talos re-renders
// from it (ManifestsAtTarget). The engine applies the first and syncs Talos' own
// re-render; plan predicts both from the same functions.

// RenderStage returns stage s's config for node n of an upgrade to target, from the
// node's active config cfg: each component's image at the version the stage wants
// (DesiredVersion, its pins read from n's kubelet version). The run applies it; plan
// predicts with it what the run will apply (ManifestsAtTarget).
func RenderStage(s KubernetesStage, n discovery.Node, cfg config.Provider, target Version) (*render.Result, error) {
	versions, err := stageVersions(s, n, cfg, target)
	if err != nil {
		return nil, err
	}

	res, err := render.Render(cfg, versions)
	if err != nil {
		return nil, fmt.Errorf("node %q: render: %w", n.Name, err)
	}

	return res, nil
}

// StageChanges returns the images RenderStage would change, as its Result's Changed,
// without rendering (render.Changes): whether stage s still has node n to move, at a
// small part of a render's cost.
func StageChanges(s KubernetesStage, n discovery.Node, cfg config.Provider, target Version) ([]render.Change, error) {
	versions, err := stageVersions(s, n, cfg, target)
	if err != nil {
		return nil, err
	}

	changed, err := render.Changes(cfg, versions)
	if err != nil {
		return nil, fmt.Errorf("node %q: render: %w", n.Name, err)
	}

	return changed, nil
}

// stageVersions is the version stage s wants of each component cfg carries.
func stageVersions(s KubernetesStage, n discovery.Node, cfg config.Provider, target Version) (render.Versions, error) {
	versions := render.Versions{}

	for c, image := range render.Images(cfg) {
		v, err := DesiredVersion(s, n, c, image, target)
		if err != nil {
			return nil, err
		}

		versions[c] = v.String()
	}

	return versions, nil
}

// KubeProxyObject is how the sync names the kube-proxy DaemonSet.
var KubeProxyObject = "DaemonSet " + discovery.StaticPodNamespace + "/" + discovery.KubeProxyDaemonSet

// ManifestsAtTarget returns a control plane's bootstrap manifests objs (as it renders
// them now) as Talos renders them once the node's config runs kube-proxy at target: the
// kube-proxy DaemonSet's container image from the KubeProxy stage's render of its active
// config cfg (RenderStage), the only place that render changes the manifests. The run
// syncs Talos' own re-render of that config; plan dry-runs this prediction of it through
// the same ManifestApplier.Check, so both meet the same conflicts. objs is not changed.
func ManifestsAtTarget(objs []*unstructured.Unstructured, n discovery.Node, cfg config.Provider, target Version) ([]*unstructured.Unstructured, error) {
	res, err := RenderStage(KubeProxy{}, n, cfg, target)
	if err != nil {
		return nil, err
	}

	image, ok := render.Images(res.Config)[discovery.KubeProxy]

	out := make([]*unstructured.Unstructured, 0, len(objs))

	for _, obj := range objs {
		obj = obj.DeepCopy()

		if ok && IsKubeProxy(obj) {
			if err := setContainerImage(obj, discovery.KubeProxyDaemonSet, image); err != nil {
				return nil, fmt.Errorf("%s: %w", KubeProxyObject, err)
			}
		}

		out = append(out, obj)
	}

	return out, nil
}

// IsKubeProxy reports whether obj is the kube-proxy DaemonSet.
func IsKubeProxy(obj *unstructured.Unstructured) bool {
	return obj.GetKind() == "DaemonSet" && obj.GetName() == discovery.KubeProxyDaemonSet && obj.GetNamespace() == discovery.StaticPodNamespace
}

// setContainerImage sets the image of the container named name of a pod template's
// object.
func setContainerImage(obj *unstructured.Unstructured, name, image string) error {
	containers, _, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return err
	}

	for _, c := range containers {
		if m, _ := c.(map[string]any); m != nil && m["name"] == name {
			m["image"] = image
		}
	}

	return unstructured.SetNestedSlice(obj.Object, containers, "spec", "template", "spec", "containers")
}
