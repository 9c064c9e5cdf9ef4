package cluster

import (
	"context"
	"fmt"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// Talos 1.14 marks each bootstrap manifest object it creates as a member of its
// inventory (internal/app/machined/pkg/controllers/k8s/manifest_apply.go, with
// go-kubernetes' ssa.InventoryAnnotationKey).
const (
	inventoryAnnotation = "config.k8s.io/owning-inventory"
	inventoryName       = "talos-bootstrap-manifests-inventory"
)

// applyBootstrapManifests does what Talos does once a cluster bootstraps:
// server-side apply the control plane's Manifest resources with field
// manager "talos", on Talos 1.14 with its inventory annotation.
func applyBootstrapManifests(ctx context.Context, cfg *rest.Config, m *machine.Machine) error {
	list, err := safe.StateListAll[*k8s.Manifest](ctx, m.COSI())
	if err != nil {
		return fmt.Errorf("list manifests of %s: %w", m.Name(), err)
	}
	version, err := m.Version()
	if err != nil {
		return err
	}
	var major, minor int
	_, _ = fmt.Sscanf(version, "v%d.%d", &major, &minor)
	inventory := major == 1 && minor >= 14
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for res := range list.All() {
		for _, item := range res.TypedSpec().Items {
			obj := (&unstructured.Unstructured{Object: item.Object}).DeepCopy()
			if inventory {
				annotations := obj.GetAnnotations()
				if annotations == nil {
					annotations = map[string]string{}
				}
				annotations[inventoryAnnotation] = inventoryName
				obj.SetAnnotations(annotations)
			}
			gvk := obj.GroupVersionKind()
			mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				mapper.Reset()
				if mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
					return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
				}
			}
			data, err := obj.MarshalJSON()
			if err != nil {
				return err
			}
			var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
			if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
				ns := obj.GetNamespace()
				if ns == "" {
					ns = metav1.NamespaceDefault
				}
				ri = dyn.Resource(mapping.Resource).Namespace(ns)
			}
			force := true
			if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "talos", Force: &force}); err != nil {
				return fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
			}
		}
	}
	return nil
}
