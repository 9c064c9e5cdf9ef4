package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sort"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// applyBootstrapManifests does what Talos' ManifestApplyController does once a
// cluster bootstraps: server-side apply the objects of the control plane's
// Manifest resources (in ID order, Namespaces then CustomResourceDefinitions
// first) with field manager "talos", on Talos 1.14 with its inventory
// annotation. An object Talos takes for a problem of the manifest (a kind the
// cluster does not serve, one the apiserver rejects as bad or invalid) is
// logged and left out, and the others are applied; any other error stops it.
func applyBootstrapManifests(ctx context.Context, cfg *rest.Config, m *machine.Machine, log *slog.Logger) error {
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
	var objs []*unstructured.Unstructured
	for res := range list.All() {
		for _, item := range res.TypedSpec().Items {
			objs = append(objs, (&unstructured.Unstructured{Object: item.Object}).DeepCopy())
		}
	}
	sort.SliceStable(objs, func(i, j int) bool { return applyRank(objs[i]) < applyRank(objs[j]) })
	for _, obj := range objs {
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
			if mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); meta.IsNoMatchError(err) {
				log.Warn("bootstrap manifests: left out", "object", gvk.Kind+" "+obj.GetName(), "err", err)
				continue
			}
			if err != nil {
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
		_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "talos", Force: &force})
		if apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsMethodNotSupported(err) {
			log.Warn("bootstrap manifests: left out", "object", gvk.Kind+" "+obj.GetNamespace()+"/"+obj.GetName(), "err", err)
			continue
		}
		if err != nil {
			return fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	return nil
}

// applyRank puts Namespaces, then CustomResourceDefinitions, before
// everything else, as Talos sorts the objects it applies.
func applyRank(obj *unstructured.Unstructured) int {
	switch obj.GroupVersionKind().GroupKind().String() {
	case "Namespace":
		return 0
	case "CustomResourceDefinition.apiextensions.k8s.io":
		return 1
	default:
		return 2
	}
}
