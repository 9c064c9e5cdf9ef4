package kube

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// ManifestApplier server-side applies bootstrap manifests as Talos does (field manager
// FieldManager, Namespaces and CustomResourceDefinitions first), but as a careful
// operator would: a server-side dry run of every object first, and no field another
// manager owns taken over unless asked.
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

// ForceAll in SyncOptions.Force takes over every conflicting field.
const ForceAll = "all"

// SyncOptions says what a sync may take over.
type SyncOptions struct {
	// Force lists the objects ("Kind namespace/name", "Kind name" for a cluster-scoped
	// one) whose fields owned by another manager the sync takes over; ForceAll for
	// every object.
	Force []string
}

func (o SyncOptions) forced(name string) bool {
	for _, f := range o.Force {
		if f == ForceAll || f == name {
			return true
		}
	}

	return false
}

// Skipped is an object a sync left alone: another manager owns fields the apply would
// take over.
type Skipped struct {
	// Object is "Kind namespace/name".
	Object string
	// Conflict is the apiserver's word on it (the fields and their managers).
	Conflict string
}

// SyncResult is what a sync did.
type SyncResult struct {
	// Applied are the objects applied.
	Applied []string
	// Skipped are the objects left alone.
	Skipped []Skipped
}

// ObjectName is how a sync names obj: "Kind namespace/name", or "Kind name".
func ObjectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return obj.GetKind() + " " + ns + "/" + obj.GetName()
	}

	return obj.GetKind() + " " + obj.GetName()
}

// Check dry-runs objs server-side and returns the objects the sync would skip (fields
// owned by another manager that it would take over, not forced), or the first error
// naming its object. Nothing is changed.
func (a *ManifestApplier) Check(ctx context.Context, objs []*unstructured.Unstructured, opts SyncOptions) ([]Skipped, error) {
	ordered := ordered(objs)
	creates := creates(ordered)

	var skipped []Skipped

	for _, obj := range ordered {
		err := a.apply(ctx, obj, opts.forced(ObjectName(obj)), true)

		switch {
		case err == nil:
		case apierrors.IsConflict(err):
			skipped = append(skipped, Skipped{Object: ObjectName(obj), Conflict: conflictText(err)})
		case dependsOnSet(obj, creates, err):
			// Its Namespace or CRD is in the set and not there yet: the dry run cannot
			// judge it before the real apply creates that.
		default:
			return skipped, err
		}
	}

	return skipped, nil
}

// Sync applies objs: a server-side dry run of every object first, so that an object the
// runner may not write, or that the apiserver refuses, stops the sync before anything
// is changed; then every object, less those whose fields another manager owns and the
// apply would take over (skipped unless forced). Nothing is pruned. An error names its
// object; the result says what was applied before it.
func (a *ManifestApplier) Sync(ctx context.Context, objs []*unstructured.Unstructured, opts SyncOptions) (*SyncResult, error) {
	res := &SyncResult{}

	skipped, err := a.Check(ctx, objs, opts)
	if err != nil {
		return res, err
	}

	skip := map[string]bool{}
	for _, s := range skipped {
		skip[s.Object] = true
	}

	res.Skipped = skipped

	for _, obj := range ordered(objs) {
		name := ObjectName(obj)
		if skip[name] {
			continue
		}

		err := a.apply(ctx, obj, opts.forced(name), false)
		if apierrors.IsConflict(err) {
			res.Skipped = append(res.Skipped, Skipped{Object: name, Conflict: conflictText(err)})

			continue
		}

		if err != nil {
			return res, err
		}

		res.Applied = append(res.Applied, name)
	}

	return res, nil
}

// Apply applies objs with conflicts forced, as Talos does, and returns how many it
// applied. It stops at the first failure, naming the object.
func (a *ManifestApplier) Apply(ctx context.Context, objs []*unstructured.Unstructured) (int, error) {
	for i, obj := range ordered(objs) {
		if err := a.apply(ctx, obj, true, false); err != nil {
			return i, err
		}
	}

	return len(objs), nil
}

func ordered(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	out := append([]*unstructured.Unstructured(nil), objs...)
	sort.SliceStable(out, func(i, j int) bool { return applyRank(out[i]) < applyRank(out[j]) })

	return out
}

// creates are the Namespaces and the CRDs' kinds that objs define.
func creates(objs []*unstructured.Unstructured) map[string]bool {
	out := map[string]bool{}

	for _, obj := range objs {
		switch obj.GroupVersionKind().GroupKind().String() {
		case "Namespace":
			out["ns/"+obj.GetName()] = true
		case "CustomResourceDefinition.apiextensions.k8s.io":
			group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
			kind, _, _ := unstructured.NestedString(obj.Object, "spec", "names", "kind")
			out["kind/"+kind+"."+group] = true
		}
	}

	return out
}

// dependsOnSet reports whether err is obj's Namespace or kind missing while the set
// itself defines it.
func dependsOnSet(obj *unstructured.Unstructured, creates map[string]bool, err error) bool {
	if meta.IsNoMatchError(errors.Unwrap(err)) || meta.IsNoMatchError(err) {
		return creates["kind/"+obj.GroupVersionKind().Kind+"."+obj.GroupVersionKind().Group]
	}

	return apierrors.IsNotFound(err) && creates["ns/"+obj.GetNamespace()]
}

// conflictText is the apiserver's conflict message, on one line.
func conflictText(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return strings.Join(strings.Fields(status.Status().Message), " ")
	}

	return strings.Join(strings.Fields(err.Error()), " ")
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

func (a *ManifestApplier) apply(ctx context.Context, obj *unstructured.Unstructured, force, dryRun bool) error {
	gvk := obj.GroupVersionKind()
	name := ObjectName(obj)
	verb := "apply"

	if dryRun {
		verb = "dry-run apply"
	}

	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset()
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}

	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, name, err)
	}

	var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)

	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}

		ri = a.dyn.Resource(mapping.Resource).Namespace(ns)
	}

	// Talos 1.14 marks the objects it creates as its inventory's: keep the mark,
	// or an unchanged manifest would change (and an RBAC object be refused).
	obj = keepInventory(ctx, ri, obj)

	data, err := obj.MarshalJSON()
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, name, err)
	}

	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: &force}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}

	err = Retry(ctx, 0, func(ctx context.Context) error {
		_, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)

		return err
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", verb, name, err)
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
