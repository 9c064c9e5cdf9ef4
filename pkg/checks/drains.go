package checks

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// PreviewDrains says, for every node the plan cordons and drains (a node
// with changes in the Kubelets or TalosOS stage), in the plan's order, what
// its drain would meet now: the pods it evicts by kubectl drain's rules (the
// rules the drain itself runs), what would stop it (a pod with no
// controller, a budget that allows no disruption) and what it would hurt
// (emptyDir data, a workload's only pod, a pod no other node can take).
func PreviewDrains(ctx context.Context, snap *discovery.Snapshot, w *discovery.Workloads, plan *api.Plan) []api.NodeDrain {
	drained := drainedNodes(plan)
	if len(drained) == 0 {
		return nil
	}

	byNode := map[string][]corev1.Pod{}
	perController := map[types.UID]int{}

	for _, p := range w.Pods {
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)

		if ref := metav1.GetControllerOf(&p); ref != nil && !finished(&p) {
			perController[ref.UID]++
		}
	}

	budgets := blockingBudgets(snap)
	out := make([]api.NodeDrain, 0, len(drained))

	for _, name := range drained {
		nd := api.NodeDrain{Node: name}

		for _, v := range kube.PreviewDrain(ctx, byNode[name], w.DaemonSets) {
			pod := v.Pod
			key := pod.Namespace + "/" + pod.Name

			if v.Refusal != "" {
				kind := api.DrainRefused
				if metav1.GetControllerOf(pod) == nil {
					kind = api.DrainNoController
				}

				nd.Blockers = append(nd.Blockers, api.DrainFinding{Kind: kind, Pod: key, Detail: refusalDetail(kind, v.Refusal)})

				continue
			}

			if !v.Evict {
				continue
			}

			nd.Evict++

			for _, b := range budgets {
				if b.namespace == pod.Namespace && b.selector.Matches(labels.Set(pod.Labels)) {
					nd.Blockers = append(nd.Blockers, api.DrainFinding{Kind: api.DrainBudget, Pod: key,
						Detail: fmt.Sprintf("budget %s/%s allows 0 disruptions now", b.namespace, b.name)})
				}
			}

			if v.Warning != "" {
				nd.Risks = append(nd.Risks, api.DrainFinding{Kind: api.DrainLocalData, Pod: key,
					Detail: "emptyDir data is deleted with the pod"})
			}

			if ref := metav1.GetControllerOf(pod); ref != nil && perController[ref.UID] == 1 {
				nd.Risks = append(nd.Risks, api.DrainFinding{Kind: api.DrainSingleReplica, Pod: key,
					Detail: fmt.Sprintf("the only pod of %s %s: it is down until it runs elsewhere", strings.ToLower(ref.Kind), ref.Name)})
			}

			if !fitsElsewhere(pod, name, snap) {
				nd.Risks = append(nd.Risks, api.DrainFinding{Kind: api.DrainNowhereToGo, Pod: key,
					Detail: "no other schedulable node meets its node selector, affinity and tolerations: it stays Pending"})
			}
		}

		out = append(out, nd)
	}

	return out
}

// drainedNodes are the nodes a stage of the plan cordons and drains, in the
// order the plan visits them.
func drainedNodes(plan *api.Plan) []string {
	var out []string

	seen := map[string]bool{}

	for _, s := range plan.Stages {
		if s.Skipped || !stages.StageWork(s.Name).Drains() {
			continue
		}

		for _, n := range s.Nodes {
			if len(n.Changes) > 0 && !seen[n.Node] {
				seen[n.Node] = true
				out = append(out, n.Node)
			}
		}
	}

	return out
}

type budget struct {
	namespace, name string
	selector        labels.Selector
}

// blockingBudgets are the budgets that refuse every eviction now.
func blockingBudgets(snap *discovery.Snapshot) []budget {
	var out []budget

	for _, p := range snap.PDBs {
		if p.DisruptionsAllowed > 0 || p.ExpectedPods == 0 {
			continue
		}

		sel, err := metav1.LabelSelectorAsSelector(p.Selector)
		if err != nil {
			continue // the API server validated it; a bad one selects nothing
		}

		out = append(out, budget{namespace: p.Namespace, name: p.Name, selector: sel})
	}

	return out
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func refusalDetail(kind, refusal string) string {
	if kind == api.DrainNoController {
		return "no controller re-creates it: the drain refuses to delete it"
	}

	return refusal
}

// fitsElsewhere reports whether some schedulable, Ready node other than
// node meets the pod's required node affinity (its node selector included)
// and has no taint the pod does not tolerate (NoSchedule, NoExecute): the
// scheduler's hard rules, less resources and pod affinity, which change by
// the minute.
func fitsElsewhere(pod *corev1.Pod, node string, snap *discovery.Snapshot) bool {
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)

	for _, n := range snap.Nodes {
		if n.Name == node || n.Unschedulable || !n.Ready {
			continue
		}

		candidate := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}, Spec: corev1.NodeSpec{Taints: n.Taints}}

		if match, err := affinity.Match(candidate); err != nil || !match {
			continue
		}

		_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Taints, pod.Spec.Tolerations, func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, false)
		if !untolerated {
			return true
		}
	}

	return false
}

// Drains shows the drain preview: REFUSED when a drain would stop (the
// upgrade would pause there), WARN when one would hurt a workload.
type Drains struct{}

// Name implements Check.
func (Drains) Name() string { return "drains" }

// Run implements Check.
func (Drains) Run(_ context.Context, in *Input) api.Check {
	if in.Drains == nil {
		return ok("no node is drained")
	}

	evict := 0
	kinds := map[string][]string{}

	var blockers, risks []string

	for _, d := range in.Drains {
		evict += d.Evict

		for _, f := range d.Blockers {
			blockers = append(blockers, fmt.Sprintf("%s: %s (%s)", d.Node, f.Pod, f.Kind))
			kinds[f.Kind] = append(kinds[f.Kind], d.Node)
		}

		for _, f := range d.Risks {
			risks = append(risks, fmt.Sprintf("%s: %s (%s)", d.Node, f.Pod, f.Kind))
		}
	}

	scope := fmt.Sprintf("%s, %s to evict", plural(len(in.Drains), "node"), plural(evict, "pod"))

	switch {
	case len(blockers) > 0:
		return refused(fmt.Sprintf("%s; would stop: %s", scope, text.Summarize(blockers)), drainActions(kinds))
	case len(risks) > 0:
		return warn(fmt.Sprintf("%s; would hurt: %s", scope, text.Summarize(risks)),
			"see Drains above (-o json lists every pod); scale the workloads up or move them first")
	}

	return ok(scope + "; nothing blocks them")
}

// drainActions says what to do for each kind of blocker found.
func drainActions(kinds map[string][]string) string {
	var out []string

	if nodes := kinds[api.DrainNoController]; len(nodes) > 0 {
		out = append(out, "run the pods with no controller under one (a Deployment) or delete them")
	}

	if nodes := kinds[api.DrainBudget]; len(nodes) > 0 {
		out = append(out, "scale the budgets' workloads up or relax the budgets (kubectl get pdb -A)")
	}

	if nodes := kinds[api.DrainRefused]; len(nodes) > 0 {
		out = append(out, "fix the pods the drain refuses")
	}

	var all []string
	for _, nodes := range kinds {
		all = append(all, nodes...)
	}

	sort.Strings(all)

	return strings.Join(out, "; ") + fmt.Sprintf("; or hold their nodes: kubectl annotate node %s %s=<reason>", all[0], discovery.HoldAnnotation)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}

	return fmt.Sprintf("%d %ss", n, word)
}
