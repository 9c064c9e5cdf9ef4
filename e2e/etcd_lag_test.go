//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// TestEtcdRaftLagUnderLoad measures what the etcd gate sees of raft lag on a
// 3-control-plane local cluster under write load (ConfigMap updates through
// the real API server, each a raft entry of the one real etcd behind the
// simulated members, which read its indexes at the moment their status call
// reaches them), and shows the judgement: read in two passes a second apart,
// every member in step passes, even one whose status answers 2 s late (fault
// etcdStatusLatency, a loaded node), where indexes compared within one pass
// differ by about 2 s of writes; a member whose raft stalled (fault
// etcdStalled) is named. The figures are logged (see stages.EtcdProgressGap).
func TestEtcdRaftLagUnderLoad(t *testing.T) {
	t.Parallel()

	faults, setFaults := faultsFile(t)
	c := startCluster(t, "--control-planes", "3", "--workers", "0", "--kubernetes", kube136, "--talos", talos113, "--faults", faults)
	tc := openTalos(t, c)

	var nodes []stages.EtcdNode
	for _, m := range c.Info.Machines {
		nodes = append(nodes, stages.EtcdNode{Name: m.Name, IP: m.IP})
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	// The API server's writes, and puts straight to etcd to reach the rate of a
	// busy cluster's (on this machine the API server alone takes a few hundred
	// a second).
	writes := startWriteLoad(t, ctx, c, 8)
	puts := startEtcdLoad(t, ctx, c.Info.EtcdURL, 32)

	// committed is the most advanced committed index a pass read.
	committed := func(v *stages.EtcdView) uint64 {
		var most uint64
		for _, s := range v.Status {
			most = max(most, s.RaftIndex)
		}

		return most
	}

	// spread is how far apart the committed indexes of one pass are.
	spread := func(v *stages.EtcdView) uint64 {
		least, most := ^uint64(0), uint64(0)
		for _, s := range v.Status {
			least, most = min(least, s.RaftIndex), max(most, s.RaftIndex)
		}

		return most - least
	}

	type round struct {
		spread       uint64
		onePass      string // the one-pass judgement's problems ("" healthy)
		twoPass      string // the two-pass judgement's
		rate         float64
		twoPassTaken time.Duration
	}

	measure := func(label string, rounds int) []round {
		t.Helper()

		var out []round

		for range rounds {
			start, w0, index0 := time.Now(), writes.Load()+puts.Load(), uint64(0)

			v := stages.ReadEtcd(ctx, tc, nodes)
			taken := time.Since(start)

			// The second pass judged alone, as the gate judged before: one
			// pass, a fixed threshold.
			one := *v
			one.Before = nil

			for _, s := range v.Before {
				index0 = max(index0, s.RaftIndex)
			}

			r := round{
				spread: spread(&one), onePass: one.Judge("").Describe(), twoPass: v.Judge("").Describe(), twoPassTaken: taken,
				rate: float64(writes.Load()+puts.Load()-w0) / taken.Seconds(),
			}
			t.Logf("%s: %.0f writes/s, the log %d entries on in %s; one pass: spread %d, %q; two passes: %q",
				label, r.rate, committed(v)-index0, taken.Round(time.Millisecond), r.spread, r.onePass, r.twoPass)

			out = append(out, r)
		}

		return out
	}

	// Let the load settle.
	time.Sleep(3 * time.Second)

	for _, r := range measure("in step", 5) {
		assert.Empty(t, r.twoPass, "every member in step")
	}

	setFaults("nodes:\n  cp-3:\n    etcdStatusLatency: 2s\n")

	tripped := 0

	for _, r := range measure("cp-3 answers 2s late", 5) {
		assert.Empty(t, r.twoPass, "every member in step, cp-3 read late")
		assert.GreaterOrEqual(t, float64(r.spread), r.rate, "read 2s apart, the indexes differ by more than a second of writes")

		if r.onePass != "" {
			tripped++
		}
	}

	t.Logf("the one-pass judgement (threshold %d) refused %d of 5 healthy reads with cp-3 2s late", stages.EtcdMaxRaftLag, tripped)

	setFaults("nodes:\n  cp-2:\n    etcdStalled: true\n")
	_ = stages.ReadEtcd(ctx, tc, nodes) // the stall begins at cp-2's first read under the fault
	time.Sleep(time.Second)

	for _, r := range measure("cp-2 stalled", 3) {
		assert.Contains(t, r.twoPass, "member cp-2 raft index", "the stalled member named")
		assert.Contains(t, r.twoPass, "it does not keep up")
	}

	stop()
	t.Logf("%d writes through the API server, %d puts to etcd", writes.Load(), puts.Load())
}

// startEtcdLoad puts keys straight to etcd (its gRPC gateway's
// /v3/kv/put) from workers goroutines until ctx ends; it returns the count
// of puts done.
func startEtcdLoad(t *testing.T, ctx context.Context, etcdURL string, workers int) *atomic.Int64 { //nolint:revive // test helper
	t.Helper()

	require.NotEmpty(t, etcdURL, "the simulator names its etcd in ready.json")

	var (
		n  atomic.Int64
		wg sync.WaitGroup
	)

	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}

	for i := range workers {
		wg.Add(1)

		go func() {
			defer wg.Done()

			key := base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("/ichor-e2e-load/%d", i)))

			for j := 0; ctx.Err() == nil; j++ {
				body := fmt.Sprintf(`{"key": %q, "value": %q}`, key, base64.StdEncoding.EncodeToString([]byte(fmt.Sprint(j))))

				req, err := http.NewRequestWithContext(ctx, http.MethodPost, etcdURL+"/v3/kv/put", strings.NewReader(body))
				if err != nil {
					return
				}

				resp, err := hc.Do(req)
				if err != nil {
					continue
				}

				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()

				if resp.StatusCode == http.StatusOK {
					n.Add(1)
				}
			}
		}()
	}

	t.Cleanup(wg.Wait)

	return &n
}

// startWriteLoad updates ConfigMaps in the default namespace from workers
// goroutines as fast as the API server takes them, until ctx ends; it
// returns the count of writes done.
func startWriteLoad(t *testing.T, ctx context.Context, c *Cluster, workers int) *atomic.Int64 { //nolint:revive // test helper
	t.Helper()

	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	require.NoError(t, err)

	cfg.QPS, cfg.Burst = 5000, 5000
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	var (
		n  atomic.Int64
		wg sync.WaitGroup
	)

	for i := range workers {
		cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("load-%d", i)},
			Data:       map[string]string{"n": "0"},
		}, metav1.CreateOptions{})
		require.NoError(t, err)

		wg.Add(1)

		go func() {
			defer wg.Done()

			for j := 1; ctx.Err() == nil; j++ {
				cm.Data["n"] = fmt.Sprint(j)

				updated, err := cs.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{})
				if err != nil {
					continue
				}

				cm = updated
				n.Add(1)
			}
		}()
	}

	t.Cleanup(wg.Wait)

	return &n
}
