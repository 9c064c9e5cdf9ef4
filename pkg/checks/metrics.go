package checks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// DeprecatedAPIsMetric is the apiserver metric that records requests to deprecated APIs.
const DeprecatedAPIsMetric = "apiserver_requested_deprecated_apis"

// RESTMetrics reads /metrics through a Kubernetes REST client
// (clientset.Discovery().RESTClient()).
type RESTMetrics struct {
	// Client is the REST client of the API server.
	Client rest.Interface
}

// Metrics implements MetricsReader.
func (m RESTMetrics) Metrics(ctx context.Context) ([]byte, error) {
	body, err := m.Client.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("get /metrics: %w", err)
	}

	return body, nil
}

// RemovedAPIs warns about APIs removed by the target minor that clients still request,
// as the apiserver's apiserver_requested_deprecated_apis metric records them. It warns and
// never refuses: the metric is per apiserver and since its start, so it can be stale.
type RemovedAPIs struct{}

// Name implements Check.
func (RemovedAPIs) Name() string { return "removed APIs" }

// Run implements Check.
func (RemovedAPIs) Run(ctx context.Context, in *Input) api.Check {
	if in.Metrics == nil {
		return warn("could not run: no metrics reader", "")
	}

	body, err := in.Metrics.Metrics(ctx)

	switch {
	case apierrors.IsForbidden(err):
		return warn("could not run: RBAC denied \"get\" on the non-resource URL /metrics",
			"grant it (kubectl auth can-i get /metrics) to have removed APIs checked")
	case err != nil:
		return warn(fmt.Sprintf("could not run: %s", strings.Join(strings.Fields(err.Error()), " ")), "")
	}

	removed, err := parseRemovedAPIs(body, in.Target)
	if err != nil {
		return warn(fmt.Sprintf("could not run: parse /metrics: %v", err), "")
	}

	if len(removed) == 0 {
		return ok(fmt.Sprintf("no API removed by %s requested since the apiserver started", in.Target.MinorString()))
	}

	return warn(text.Summarize(removed), "update the clients that use them before upgrading")
}

// parseRemovedAPIs returns "group/version resource requested (removed in X.Y)" for every
// deprecated API requested whose removal release is at or before target.
func parseRemovedAPIs(body []byte, target stages.Version) ([]string, error) {
	lines, err := familyLines(body, DeprecatedAPIsMetric)
	if err != nil {
		return nil, err
	}

	parser := expfmt.NewTextParser(model.UTF8Validation)

	families, err := parser.TextToMetricFamilies(bytes.NewReader(lines))
	if err != nil {
		return nil, err
	}

	family, found := families[DeprecatedAPIsMetric]
	if !found {
		return nil, nil
	}

	seen := map[string]bool{}

	var out []string

	for _, m := range family.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}

		if m.GetGauge() != nil && m.GetGauge().GetValue() == 0 {
			continue
		}

		if !removedBy(labels["removed_release"], target) {
			continue
		}

		gv := labels["version"]
		if labels["group"] != "" {
			gv = labels["group"] + "/" + gv
		}

		resource := labels["resource"]
		if labels["subresource"] != "" {
			resource += "/" + labels["subresource"]
		}

		line := fmt.Sprintf("%s %s requested (removed in %s)", gv, resource, labels["removed_release"])
		if !seen[line] {
			seen[line] = true
			out = append(out, line)
		}
	}

	sort.Strings(out)

	return out, nil
}

// familyLines keeps the lines of one metric family (its HELP and TYPE comments and its
// samples) out of a Prometheus text exposition. An apiserver's /metrics is megabytes and
// parsing all of it cost a plan of a 1000-node cluster a tenth of its CPU; the family
// is a few lines. A body with no HELP or TYPE comment at all is not an exposition.
func familyLines(body []byte, name string) ([]byte, error) {
	var (
		out        []byte
		exposition bool
	)

	for rest := body; len(rest) > 0; {
		var line []byte

		line, rest, _ = bytes.Cut(rest, []byte("\n"))

		switch {
		case bytes.HasPrefix(line, []byte("# HELP ")), bytes.HasPrefix(line, []byte("# TYPE ")):
			exposition = true

			if f := bytes.Fields(line); len(f) >= 3 && string(f[2]) == name {
				out = append(append(out, line...), '\n')
			}
		case len(line) > len(name) && bytes.HasPrefix(line, []byte(name)) && (line[len(name)] == '{' || line[len(name)] == ' '):
			out = append(append(out, line...), '\n')
		}
	}

	if !exposition {
		return nil, errors.New("not in the Prometheus text format (no HELP or TYPE line)")
	}

	return out, nil
}

// removedBy reports whether a removal release "X.Y" is at or before the target's minor.
func removedBy(release string, target stages.Version) bool {
	var major, minor uint64

	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false
	}

	return major < target.Major || (major == target.Major && minor <= target.Minor)
}
