package plugin

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// PrintTable writes a plan as the human-readable table: the cluster, the component
// summary, the stages with their nodes in order, held and already-upgraded nodes, the
// image repositories kept, then the checks.
func PrintTable(w io.Writer, plan *api.Plan) error {
	p := &printer{w: w}

	p.cluster(plan)
	p.components(plan)
	p.stages(plan)
	p.drains(plan)
	p.checks(plan)

	return p.err
}

// printer remembers the first write error so the printing code reads straight.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) table(rows [][]string) {
	if p.err != nil {
		return
	}

	tw := tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0)

	for _, r := range rows {
		if _, p.err = fmt.Fprintln(tw, strings.Join(r, "\t")); p.err != nil {
			return
		}
	}

	p.err = tw.Flush()
}

func (p *printer) cluster(plan *api.Plan) {
	name := plan.Cluster.Name
	if name == "" {
		name = plan.Cluster.Endpoint
	}

	p.printf("Cluster %q at %s (%s, %s; Talos %s)\n\n", name, plan.Cluster.Endpoint,
		plural(plan.Cluster.ControlPlanes, "control plane"), plural(plan.Cluster.Workers, "worker"), counts(plan.Cluster.Talos))
}

func (p *printer) components(plan *api.Plan) {
	rows := [][]string{{"COMPONENT", "CURRENT", "TARGET"}}
	for _, c := range plan.Components {
		rows = append(rows, []string{c.Name, counts(c.Current), c.Target})
	}

	p.table(rows)
	p.printf("\n")
}

func (p *printer) stages(plan *api.Plan) {
	for i, s := range plan.Stages {
		p.printf("Stage %d/%d %s: %s\n", i+1, len(plan.Stages), s.Name, s.Description)

		if s.Skipped {
			p.printf("  skipped: %s\n", s.SkipReason)

			continue
		}

		if len(s.Nodes) == 0 {
			p.printf("  no node to upgrade\n")
		}

		var rows [][]string

		last := 0

		for _, n := range s.Nodes {
			batch := ""
			if n.Batch != last {
				batch, last = fmt.Sprintf("%d.", n.Batch), n.Batch
			}

			node := n.Node
			if n.Self {
				node += " (runs the job: last)"
			}

			rows = append(rows, []string{"  " + batch, node, n.Role, changes(n.Changes)})
		}

		p.table(rows)

		if s.After != "" {
			p.printf("  then: %s\n", s.After)
		}
	}

	for _, h := range plan.Held {
		p.printf("Held: %s (%s)\n", h.Node, h.Reason)
	}

	if len(plan.AtTarget) > 0 {
		p.printf("Already at %s: %s\n", plan.Target, strings.Join(plan.AtTarget, ", "))
	}

	if layouts := configLayouts(plan); layouts != "" {
		p.printf("Machine configs, each image changed where it is: %s\n", layouts)
	}

	if repos := repositories(plan); repos != "" {
		p.printf("Images, repositories kept: %s\n", repos)
	}

	p.printf("\n")
}

// drainLines bounds the drain preview in the table; -o json has it whole.
const drainLines = 20

// drains prints what the drains would meet, node by node, only the nodes
// with a blocker or a risk.
func (p *printer) drains(plan *api.Plan) {
	var rows [][]string

	more := 0

	for _, d := range plan.Drains {
		for _, list := range [][]api.DrainFinding{d.Blockers, d.Risks} {
			for _, f := range list {
				if len(rows) == drainLines {
					more++

					continue
				}

				what := "risk"
				if isBlocker(f.Kind) {
					what = "BLOCKS"
				}

				rows = append(rows, []string{"  " + d.Node, f.Pod, what, f.Kind + ": " + f.Detail})
			}
		}
	}

	if len(rows) == 0 {
		return
	}

	p.printf("Drains, what they would meet now:\n")
	p.table(rows)

	if more > 0 {
		p.printf("  ... and %d more (-o json lists them all)\n", more)
	}

	p.printf("\n")
}

func isBlocker(kind string) bool {
	return kind == api.DrainNoController || kind == api.DrainRefused || kind == api.DrainBudget
}

func (p *printer) checks(plan *api.Plan) {
	rows := [][]string{{"CHECK", "RESULT", "DETAIL"}}

	var long []api.Check

	for _, c := range plan.Checks {
		detail := c.Detail

		switch {
		case strings.Contains(c.Action, "\n"):
			long = append(long, c)
			detail += " (see below)"
		case c.Action != "" && c.Result != api.ResultOK:
			detail += ": " + c.Action
		}

		rows = append(rows, []string{c.Name, c.Result, detail})
	}

	p.table(rows)

	for _, c := range long {
		p.printf("\n%s: %s", c.Name, c.Action)

		if !strings.HasSuffix(c.Action, "\n") {
			p.printf("\n")
		}
	}
}

// changes prints a node's changes: tags when the repository is kept, else whole images.
func changes(list []api.Change) string {
	if len(list) == 0 {
		return "no change (verify only)"
	}

	parts := make([]string, 0, len(list))

	for _, c := range list {
		from, to := c.From, c.To

		if c.Component == "installer" {
			if c.Reason != "" {
				to += " (" + c.Reason + ")"
			}

			parts = append(parts, "installer "+to)

			continue
		}

		if render.RepositoryOf(from) != "" && render.RepositoryOf(from) == render.RepositoryOf(to) {
			from, to = render.TagOf(from), render.TagOf(to)
		}

		part := fmt.Sprintf("%s %s -> %s", c.Component, from, to)
		if c.DroppedDigest != "" {
			part += fmt.Sprintf(" (digest %s dropped: pin the new one if you need it)", c.DroppedDigest)
		}

		parts = append(parts, part)
	}

	return strings.Join(parts, ", ")
}

// repositories says where the plan's images come from: each registry path (the image
// repository without its last element) with the nodes whose images use it.
// configLayouts says which nodes keep their Kubernetes images in which
// layout, for a Kubernetes plan: "v1alpha1 (5 nodes)", or
// "v1alpha1 (cp-1, worker-1), multi-doc (cp-2), mixed (cp-3)".
func configLayouts(plan *api.Plan) string {
	if plan.Upgrade != "kubernetes" {
		return ""
	}

	nodesOf := map[string]map[string]bool{}

	for _, s := range plan.Stages {
		for _, n := range s.Nodes {
			if n.ConfigLayout == "" {
				continue
			}

			if nodesOf[n.ConfigLayout] == nil {
				nodesOf[n.ConfigLayout] = map[string]bool{}
			}

			nodesOf[n.ConfigLayout][n.Node] = true
		}
	}

	var parts []string

	for _, layout := range []string{api.LayoutV1Alpha1, api.LayoutMultiDoc, api.LayoutMixed} {
		if len(nodesOf[layout]) > 0 {
			parts = append(parts, fmt.Sprintf("%s (%s)", layout, nodeList(nodesOf[layout])))
		}
	}

	return strings.Join(parts, ", ")
}

// nodeList names a few nodes, sorted, or counts many.
func nodeList(set map[string]bool) string {
	nodes := make([]string, 0, len(set))
	for n := range set {
		nodes = append(nodes, n)
	}

	sort.Strings(nodes)

	if len(nodes) > 3 {
		return fmt.Sprintf("%d nodes", len(nodes))
	}

	return strings.Join(nodes, ", ")
}

func repositories(plan *api.Plan) string {
	nodesOf := map[string]map[string]bool{}

	var order []string

	for _, s := range plan.Stages {
		for _, n := range s.Nodes {
			for _, c := range n.Changes {
				repo := render.RepositoryOf(c.To)
				if repo == "" || c.Component == "talos" {
					continue
				}

				dir := repo[:strings.LastIndex(repo, "/")+1]
				if nodesOf[dir] == nil {
					nodesOf[dir] = map[string]bool{}
					order = append(order, dir)
				}

				nodesOf[dir][n.Node] = true
			}
		}
	}

	parts := make([]string, 0, len(order))

	for _, dir := range order {
		parts = append(parts, fmt.Sprintf("%s* (%s)", dir, nodeList(nodesOf[dir])))
	}

	return strings.Join(parts, ", ")
}

func counts(list []api.VersionCount) string {
	if len(list) == 0 {
		return "none"
	}

	parts := make([]string, 0, len(list))
	for _, v := range list {
		parts = append(parts, fmt.Sprintf("%s x%d", v.Version, v.Count))
	}

	return strings.Join(parts, ", ")
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}

	return fmt.Sprintf("%d %ss", n, word)
}
