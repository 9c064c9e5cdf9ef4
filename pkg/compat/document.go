package compat

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// PathCheck is the name of the path's own check row.
const PathCheck = "path"

// Document is the UpgradePath document of req: the path found, or the refusal (err) as
// its "path" check. Each hop's Plan is left to the caller, which plans it.
func Document(req Request, path *Path, err error) api.UpgradePath {
	doc := api.UpgradePath{
		APIVersion: api.APIVersion,
		Kind:       api.KindUpgradePath,
		Start:      startVersions(req.Nodes),
		Hops:       []api.Hop{},
	}

	if t := req.Targets.Talos; t != nil {
		doc.Targets.Talos = t.String()
	}

	if k := req.Targets.Kubernetes; k != nil {
		doc.Targets.Kubernetes = k.String()
	}

	for _, v := range req.Via {
		doc.Via = append(doc.Via, v.String())
	}

	for _, n := range req.Nodes {
		if n.Held {
			reason := discovery.HoldAnnotation
			if n.HoldReason != "" {
				reason += ": " + n.HoldReason
			}

			doc.Held = append(doc.Held, api.NodeNote{Node: n.Name, Reason: reason})
		}
	}

	if err != nil {
		row := api.Check{Name: PathCheck, Result: api.ResultRefused, Detail: err.Error(), Action: "plan again"}

		var refusal *Refusal
		if errors.As(err, &refusal) {
			row.Detail, row.Action = refusal.Reason, refusal.Action
		}

		doc.Checks = []api.Check{row}

		return doc
	}

	labels := make([]string, 0, len(path.Hops))

	for i, h := range path.Hops {
		from := make([]string, 0, len(h.From))
		for _, v := range h.From {
			from = append(from, v.String())
		}

		doc.Hops = append(doc.Hops, api.Hop{
			Number: i + 1, Upgrade: h.Kind, From: from, To: h.To.String(),
			Source: h.Source, SourceDetail: h.SourceDetail, Reason: h.Reason,
		})
		labels = append(labels, h.label())
	}

	detail := "the cluster runs the targets already"
	if len(labels) > 0 {
		detail = fmt.Sprintf("%d hop(s), each legal when it starts: %s", len(labels), strings.Join(labels, ", "))
	}

	doc.Checks = []api.Check{{Name: PathCheck, Result: api.ResultOK, Detail: detail}}
	doc.Runnable = true

	return doc
}

// startVersions counts the versions the nodes (held nodes apart) run, oldest first: each
// Talos version by its nodes, each Kubernetes version by the nodes that run it in any
// component. A version that cannot be read is counted as written.
func startVersions(nodes []Node) api.PathVersions {
	talos, kube := map[string]int{}, map[string]int{}

	for _, n := range active(nodes) {
		if n.Talos != "" {
			talos[n.Talos]++
		}

		seen := map[string]bool{}

		for _, c := range n.Kubernetes {
			if !seen[c.Version] {
				seen[c.Version] = true
				kube[c.Version]++
			}
		}
	}

	return api.PathVersions{Talos: counted(talos), Kubernetes: counted(kube)}
}

// counted is counts as VersionCounts, oldest first (what does not parse first, by text).
func counted(counts map[string]int) []api.VersionCount {
	out := make([]api.VersionCount, 0, len(counts))
	for v, n := range counts {
		out = append(out, api.VersionCount{Version: v, Count: n})
	}

	slices.SortFunc(out, func(a, b api.VersionCount) int {
		va, errA := ParseVersion(a.Version)
		vb, errB := ParseVersion(b.Version)

		switch {
		case errA != nil && errB != nil:
			return strings.Compare(a.Version, b.Version)
		case errA != nil:
			return -1
		case errB != nil:
			return 1
		}

		return va.Compare(vb)
	})

	return out
}
