package kube

import (
	"context"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clientdiscovery "k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// FieldManager is the field manager Talos applies its bootstrap manifests
// with; ichor applies them under the same name, so ownership stays Talos'.
const FieldManager = "talos"

// ManifestApplier server-side applies bootstrap manifests as Talos does:
// field manager FieldManager, conflicts forced, Namespaces and
// CustomResourceDefinitions first.
type ManifestApplier struct {
	dyn    dynamic.Interface
	mapper meta.ResettableRESTMapper
}

// NewManifestApplier returns a ManifestApplier that maps kinds to resources
// through disc (cached; refreshed once when a kind is not found, such as a
// CRD an earlier manifest just created).
func NewManifestApplier(dyn dynamic.Interface, disc clientdiscovery.DiscoveryInterface) *ManifestApplier {
	return &ManifestApplier{
		dyn:    dyn,
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)),
	}
}

// Apply applies objs and returns how many it applied. It stops at the first
// failure, naming the object.
func (a *ManifestApplier) Apply(ctx context.Context, objs []*unstructured.Unstructured) (int, error) {
	ordered := append([]*unstructured.Unstructured(nil), objs...)
	sort.SliceStable(ordered, func(i, j int) bool { return applyRank(ordered[i]) < applyRank(ordered[j]) })

	for i, obj := range ordered {
		if err := a.apply(ctx, obj); err != nil {
			return i, err
		}
	}

	return len(ordered), nil
}

// applyRank puts Namespaces, then CRDs, before everything else.
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

func (a *ManifestApplier) apply(ctx context.Context, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	name := gvk.Kind + " " + obj.GetName()

	if ns := obj.GetNamespace(); ns != "" {
		name = gvk.Kind + " " + ns + "/" + obj.GetName()
	}

	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset()
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}

	if err != nil {
		return fmt.Errorf("apply %s: %w", name, err)
	}

	var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)

	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}

		ri = a.dyn.Resource(mapping.Resource).Namespace(ns)
	}

	obj = keepInventory(ctx, ri, obj)

	data, err := obj.MarshalJSON()
	if err != nil {
		return fmt.Errorf("apply %s: %w", name, err)
	}

	force := true

	err = Retry(ctx, 0, func(ctx context.Context) error {
		_, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})

		return err
	})
	if err != nil {
		return fmt.Errorf("apply %s: %w", name, err)
	}

	return nil
}

// InventoryAnnotation marks an object as a member of Talos' inventory of bootstrap
// manifests: Talos (1.14) sets it on each object it creates, with its field manager.
const InventoryAnnotation = "config.k8s.io/owning-inventory"

// keepInventory returns obj with the live object's InventoryAnnotation, if it has one:
// applied with Talos' field manager, an object without it would lose it, so that an
// unchanged manifest would change the object (and its membership of Talos' inventory).
// When the live object cannot be read, obj is applied as it is.
func keepInventory(ctx context.Context, ri dynamic.ResourceInterface, obj *unstructured.Unstructured) *unstructured.Unstructured {
	live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		return obj
	}

	v, ok := live.GetAnnotations()[InventoryAnnotation]
	if !ok {
		return obj
	}

	obj = obj.DeepCopy()
	annotations := obj.GetAnnotations()

	if annotations == nil {
		annotations = map[string]string{}
	}

	if _, set := annotations[InventoryAnnotation]; !set {
		annotations[InventoryAnnotation] = v
	}

	obj.SetAnnotations(annotations)

	return obj
}
