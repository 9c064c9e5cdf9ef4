package checks

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// bigMetrics is an exposition the size of a busy apiserver's (about 2 MB) with the
// deprecated-APIs family in the middle and a family whose name extends it.
func bigMetrics() []byte {
	var b bytes.Buffer

	family := func(name string, n int) {
		fmt.Fprintf(&b, "# HELP %s Some help.\n# TYPE %s histogram\n", name, name)

		for i := range n {
			fmt.Fprintf(&b, "%s_bucket{component=\"apiserver\",resource=\"r%d\",verb=\"LIST\",le=\"0.1\"} %d\n", name, i, i)
		}
	}

	family("etcd_request_duration_seconds", 10000)
	fmt.Fprintf(&b, "# HELP %s [STABLE] Gauge of deprecated APIs that have been requested.\n# TYPE %s gauge\n", DeprecatedAPIsMetric, DeprecatedAPIsMetric)
	fmt.Fprintf(&b, "%s{group=\"flowcontrol.apiserver.k8s.io\",removed_release=\"1.32\",resource=\"prioritylevelconfigurations\",subresource=\"\",version=\"v1beta3\"} 1\n", DeprecatedAPIsMetric)
	fmt.Fprintf(&b, "%s{group=\"\",removed_release=\"1.40\",resource=\"endpoints\",subresource=\"\",version=\"v1\"} 1\n", DeprecatedAPIsMetric)
	fmt.Fprintf(&b, "# HELP %s_other Not the family.\n# TYPE %s_other counter\n%s_other{group=\"x\",removed_release=\"1.0\"} 3\n", DeprecatedAPIsMetric, DeprecatedAPIsMetric, DeprecatedAPIsMetric)
	family("apiserver_request_duration_seconds", 10000)

	return b.Bytes()
}

func TestParseRemovedAPIsKeepsOnlyTheFamily(t *testing.T) {
	body := bigMetrics()
	require.Greater(t, len(body), 1<<20)

	removed, err := parseRemovedAPIs(body, stages.MustParseVersion("v1.36.3"))
	require.NoError(t, err)
	assert.Equal(t, []string{"flowcontrol.apiserver.k8s.io/v1beta3 prioritylevelconfigurations requested (removed in 1.32)"}, removed)

	lines, err := familyLines(body, DeprecatedAPIsMetric)
	require.NoError(t, err)
	assert.Equal(t, 4, bytes.Count(lines, []byte("\n")), string(lines))
	assert.NotContains(t, string(lines), "_other")

	_, err = familyLines([]byte("<html>not metrics</html>"), DeprecatedAPIsMetric)
	require.ErrorContains(t, err, "not in the Prometheus text format")
}

func BenchmarkParseRemovedAPIs(b *testing.B) {
	body := bigMetrics()
	target := stages.MustParseVersion("v1.36.3")

	for b.Loop() {
		if _, err := parseRemovedAPIs(body, target); err != nil {
			b.Fatal(err)
		}
	}
}
