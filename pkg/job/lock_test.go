package job

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// An apiserver that went away with a connection open (its control plane rebooting)
// answers nothing on it: the lock's client gives up on that request and reads the
// Lease again on a new connection, over HTTP/1.1 even from a server that speaks
// HTTP/2, so that a renewal never waits on the dead connection.
func TestLockClientLeavesAHungConnection(t *testing.T) {
	var (
		mu     sync.Mutex
		conns  []string
		protos []int
		hung   bool
	)

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		conns, protos = append(conns, req.RemoteAddr), append(protos, req.ProtoMajor)
		hang := !hung
		hung = true
		mu.Unlock()

		if hang {
			<-req.Context().Done()

			return
		}

		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&coordinationv1.Lease{
			TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
			ObjectMeta: metav1.ObjectMeta{Name: LockName, Namespace: LockNamespace},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("ichor-system/runner-1")},
		})
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)

	cfg := LockClientConfig(&rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	assert.Equal(t, LockRequestTimeout, cfg.Timeout)

	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)

	_, err = ReadLock(context.Background(), client)
	require.Error(t, err, "the hung request gives up")

	lock, err := ReadLock(context.Background(), client)
	require.NoError(t, err, "the next read answers")
	assert.Equal(t, "ichor-system/runner-1", lock.Holder)

	mu.Lock()
	defer mu.Unlock()

	require.Len(t, conns, 2)
	assert.NotEqual(t, conns[0], conns[1], "the second read on a new connection")
	assert.Equal(t, []int{1, 1}, protos, "HTTP/1.1")
}
