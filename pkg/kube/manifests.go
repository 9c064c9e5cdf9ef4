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
	// Holders are the field managers the conflict names (see Holders).
	Holders []Holder `json:"holders,omitempty"`
}

// TakenOver is an object whose fields held by Talos' own earlier writes (Holder.TalosOwn)
// a sync takes over, as talosctl upgrade-k8s does.
type TakenOver struct {
	// Object is "Kind namespace/name".
	Object string
	// From are the holders whose fields the apply takes.
	From []Holder
}

// DryRun is what a server-side dry run of the manifests found: what the sync will skip,
// and what it will take over from Talos' own earlier writes.
type DryRun struct {
	// Skipped are the objects the sync leaves alone (TakeOver says no).
	Skipped []Skipped
	// TakenOver are the objects whose Talos-held fields the sync takes over.
	TakenOver []TakenOver
}

// SyncResult is what a sync did.
type SyncResult struct {
	// Applied are the objects applied.
	Applied []string
	// Skipped are the objects left alone.
	Skipped []Skipped
	// TakenOver are the applied objects whose fields Talos' own earlier writes held.
	TakenOver []TakenOver
	// Inventory is how many objects the sync recorded in Talos' inventory (0 on a
	// cluster whose Talos keeps none).
	Inventory int
}

// ObjectName is how a sync names obj: "Kind namespace/name", or "Kind name".
func ObjectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return obj.GetKind() + " " + ns + "/" + obj.GetName()
	}

	return obj.GetKind() + " " + obj.GetName()
}

// Check dry-runs objs server-side, as Sync will apply them, and returns what the sync
// would skip (fields another field manager owns that it would take over, not forced) and
// what it would take over from Talos' own earlier writes (TakeOver), or the first error
// naming its object. Nothing is changed. plan and the run call it on the same render of
// the manifests, so they see the same conflicts.
func (a *ManifestApplier) Check(ctx context.Context, objs []*unstructured.Unstructured, opts SyncOptions) (*DryRun, error) {
	inventory, err := a.inventoryPresent(ctx)
	if err != nil {
		return &DryRun{}, err
	}

	return a.check(ctx, objs, opts, inventory)
}

func (a *ManifestApplier) check(ctx context.Context, objs []*unstructured.Unstructured, opts SyncOptions, inventory bool) (*DryRun, error) {
	ordered := ordered(objs)
	creates := creates(ordered)
	dry := &DryRun{}

	for _, obj := range ordered {
		name := ObjectName(obj)
		forced := opts.forced(name)
		_, err := a.apply(ctx, obj, forced, true, inventory)

		if holders := Holders(err); apierrors.IsConflict(err) && TakeOver(holders, forced) {
			// Talos' own fields: the apply takes them, if the apiserver lets it.
			if _, err = a.apply(ctx, obj, true, true, inventory); err == nil {
				dry.TakenOver = append(dry.TakenOver, TakenOver{Object: name, From: holders})

				continue
			}
		}

		switch {
		case err == nil:
		case apierrors.IsConflict(err):
			dry.Skipped = append(dry.Skipped, Skipped{Object: name, Conflict: conflictText(err), Holders: Holders(err)})
		case dependsOnSet(obj, creates, err):
			// Its Namespace or CRD is in the set and not there yet: the dry run cannot
			// judge it before the real apply creates that.
		default:
			return dry, err
		}
	}

	return dry, nil
}

// Sync applies objs: a server-side dry run of every object first (Check), so that an
// object the runner may not write, or that the apiserver refuses, stops the sync before
// anything is changed; then every object, less those whose fields another manager owns
// and the apply would take over (skipped unless forced); fields held by Talos' own earlier
// writes are taken over (TakeOver). Nothing is pruned. On a cluster whose Talos keeps the
// inventory of its bootstrap manifests (1.13+), the sync leaves it as Talos' own pass
// would: an object it creates carries the inventory annotation, and every object of the
// manifests that exists is recorded in the inventory. An error names its object; the
// result says what was applied before it.
func (a *ManifestApplier) Sync(ctx context.Context, objs []*unstructured.Unstructured, opts SyncOptions) (*SyncResult, error) {
	res := &SyncResult{}

	inventory, err := a.inventoryPresent(ctx)
	if err != nil {
		return res, err
	}

	dry, err := a.check(ctx, objs, opts, inventory)
	if err != nil {
		return res, err
	}

	skip := map[string]bool{}
	for _, s := range dry.Skipped {
		skip[s.Object] = true
	}

	takeOver := map[string]TakenOver{}
	for _, t := range dry.TakenOver {
		takeOver[t.Object] = t
	}

	res.Skipped = dry.Skipped

	var present []string

	for _, obj := range ordered(objs) {
		name := ObjectName(obj)
		if skip[name] {
			// Left alone, but there: Talos' pass records it too.
			if key, ok := a.inventoryKey(obj); ok {
				present = append(present, key)
			}

			continue
		}

		t, taken := takeOver[name]

		key, err := a.apply(ctx, obj, opts.forced(name) || taken, false, inventory)
		if apierrors.IsConflict(err) {
			res.Skipped = append(res.Skipped, Skipped{Object: name, Conflict: conflictText(err), Holders: Holders(err)})

			continue
		}

		if err != nil {
			return res, err
		}

		res.Applied = append(res.Applied, name)
		present = append(present, key)

		if taken {
			res.TakenOver = append(res.TakenOver, t)
		}
	}

	if inventory {
		if err := a.recordInventory(ctx, present); err != nil {
			return res, err
		}

		res.Inventory = len(present)
	}

	return res, nil
}

// Apply applies objs with conflicts forced, as Talos does, and returns how many it
// applied. It stops at the first failure, naming the object.
func (a *ManifestApplier) Apply(ctx context.Context, objs []*unstructured.Unstructured) (int, error) {
	for i, obj := range ordered(objs) {
		if _, err := a.apply(ctx, obj, true, false, false); err != nil {
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

// resource maps obj to its resource client; namespaced says whether its kind is, and the
// returned namespace is the one the object goes to ("" for a cluster-scoped one).
func (a *ManifestApplier) resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, string, error) {
	gvk := obj.GroupVersionKind()

	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset()
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}

	if err != nil {
		return nil, "", err
	}

	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return a.dyn.Resource(mapping.Resource), "", nil
	}

	ns := obj.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault
	}

	return a.dyn.Resource(mapping.Resource).Namespace(ns), ns, nil
}

// apply server-side applies obj (a dry run when dryRun) under FieldManager, and returns
// its inventory key. With inventory (Talos keeps one), an object the apply creates carries
// the inventory annotation, as Talos 1.13+ creates it.
func (a *ManifestApplier) apply(ctx context.Context, obj *unstructured.Unstructured, force, dryRun, inventory bool) (string, error) {
	name := ObjectName(obj)
	verb := "apply"

	if dryRun {
		verb = "dry-run apply"
	}

	ri, ns, err := a.resource(obj)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", verb, name, err)
	}

	key := inventoryKey(obj, ns)

	// Talos marks the objects it creates as its inventory's: keep the mark, or an
	// unchanged manifest would change (and an RBAC object be refused).
	obj = markInventory(ctx, ri, obj, inventory)

	data, err := obj.MarshalJSON()
	if err != nil {
		return key, fmt.Errorf("%s %s: %w", verb, name, err)
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
		return key, fmt.Errorf("%s %s: %w", verb, name, err)
	}

	return key, nil
}
