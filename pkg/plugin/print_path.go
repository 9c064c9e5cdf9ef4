package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// PrintPath writes an upgrade path as text: what the cluster runs, the targets, each hop
// in order (n/m, kind, from -> to, where its version came from, why it is legal), the
// first hop's plan as `kubectl ichor plan kubernetes|talos` prints it, what the later
// hops plan only when they start, then the path's own check.
func PrintPath(w io.Writer, cluster string, doc *api.UpgradePath) error {
	p := &printer{w: w}

	p.printf("Cluster %q: Talos %s; Kubernetes %s\n", cluster, counts(doc.Start.Talos), counts(doc.Start.Kubernetes))
	p.printf("Targets: %s\n", pathTargets(doc))

	for _, h := range doc.Held {
		p.printf("Held: %s (%s): no hop moves it\n", h.Node, h.Reason)
	}

	n := len(doc.Hops)

	switch {
	case !doc.Runnable && n == 0:
		p.printf("\nNo path: see the path check below.\n")
	case n == 0:
		p.printf("\nNo hop: the cluster runs the targets already.\n")
	default:
		p.printf("\nPath, %s in this order, each legal when it starts:\n", plural(n, "hop"))

		for _, h := range doc.Hops {
			p.printf("  %d/%d  %-10s  %s -> %s  (%s)\n", h.Number, n, h.Upgrade, strings.Join(h.From, ", "), h.To, hopSource(h))
			p.printf("        legal: %s\n", h.Reason)

			if h.EstimateSeconds != nil {
				p.printf("        estimate: about %s\n", duration(time.Duration(*h.EstimateSeconds)*time.Second))
			}
		}

		if doc.EstimateSeconds != nil {
			p.printf("Estimate: about %s for the path (%s)\n", duration(time.Duration(*doc.EstimateSeconds)*time.Second), doc.EstimateBasis)
		} else if doc.EstimateBasis != "" {
			p.printf("Estimate: none for the whole path (%s)\n", doc.EstimateBasis)
		}
	}

	if n > 0 && doc.Hops[0].Plan != nil {
		h := doc.Hops[0]
		p.printf("\nHop 1/%d, %s %s, planned from the cluster as it is:\n\n", n, h.Upgrade, h.To)

		if p.err == nil {
			p.err = PrintTable(w, h.Plan)
		}
	}

	if n > 1 {
		p.printf("\nHops 2-%d: their stages and checks are planned when each starts, from the cluster the hop before leaves "+
			"(as `kubectl ichor plan %s --to %s` would plan hop 2 then).\n", n, doc.Hops[1].Upgrade, doc.Hops[1].To)
	}

	p.printf("\n")
	p.checks(&api.Plan{Checks: doc.Checks})

	return p.err
}

// pathTargets says what the path goes to, and the operator's --via.
func pathTargets(doc *api.UpgradePath) string {
	var parts []string

	if doc.Targets.Talos != "" {
		parts = append(parts, "Talos "+doc.Targets.Talos)
	}

	if doc.Targets.Kubernetes != "" {
		parts = append(parts, "Kubernetes "+doc.Targets.Kubernetes)
	}

	out := strings.Join(parts, ", ")
	if len(doc.Via) > 0 {
		out += fmt.Sprintf(" (via %s)", strings.Join(doc.Via, ", "))
	}

	return out
}

// hopSource says where a hop's version came from.
func hopSource(h api.Hop) string {
	if h.SourceDetail == "" || h.Source == api.SourceVia {
		return h.Source
	}

	return h.Source + ": " + h.SourceDetail
}

// printDocument writes a versioned document as -o json or -o yaml asks; what names it
// in an error.
func printDocument(w io.Writer, output, what string, doc any) error {
	if output == "yaml" {
		b, err := yaml.Marshal(doc)
		if err != nil {
			return fmt.Errorf("encode %s: %w", what, err)
		}

		_, err = w.Write(b)

		return err
	}

	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", what, err)
	}

	_, err = fmt.Fprintf(w, "%s\n", b)

	return err
}
