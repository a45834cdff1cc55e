package promcheck

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeProm answers query_range as Prometheus does: a parse error for a broken query, an
// empty matrix for a metric it has no series of, a series otherwise.
func fakeProm(t *testing.T) Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query().Get("query")
		switch {
		case strings.Contains(q, "sum("+"("):
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected \"(\""}`))
		case strings.Contains(q, "absent_metric"):
			_, _ = w.Write([]byte(`{"status":"success","data":{"resultType":"matrix","result":[]}}`))
		default:
			_, _ = w.Write([]byte(`{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"namespace":"a"},"values":[[1700000000,"1"],[1700000010,"2"]]}]}}`))
		}
	}))
	t.Cleanup(srv.Close)
	return Client{URL: srv.URL}
}

// A query that does not parse and one that returns no series both fail the check; a good
// one passes with its series.
func TestCheckFailsBrokenAndEmptyQueries(t *testing.T) {
	c := fakeProm(t)
	qs := []Query{{Panel: "good", RefID: "A", Expr: `sum(fgpu_x{namespace="a"})`},
		{Panel: "broken", RefID: "A", Expr: `sum((fgpu_x`},
		{Panel: "empty", RefID: "B", Expr: `absent_metric`}}
	end := time.Unix(1700000010, 0)
	res := Check(context.Background(), c, qs, end.Add(-time.Minute), end, 10*time.Second)
	errs := Failed(res)
	if len(errs) != 2 {
		t.Fatalf("errors %v; want the broken and the empty query", errs)
	}
	if !strings.Contains(errs[0].Error(), "parse error") || !strings.Contains(errs[1].Error(), "no series") {
		t.Errorf("errors %v", errs)
	}
	if len(res[0].Series) != 1 || res[0].Series[0].Values[1] != 2 {
		t.Errorf("good query's series %+v", res[0].Series)
	}
	out := filepath.Join(t.TempDir(), "d.png")
	if err := RenderPNG(out, "test", res); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Size() < 1000 {
		t.Errorf("rendered PNG %v %v", st, err)
	}
}

// Every query of every panel of the chart's dashboard is read, rows included, with its
// template variables filled in, and none is left unsubstituted.
func TestLoadChartDashboard(t *testing.T) {
	qs, err := LoadDashboard("../../deployments/helm/fgpu/dashboards/fgpu.json", map[string]string{"namespace": "team-a", "node": "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) < 15 {
		t.Fatalf("%d queries; the dashboard has more", len(qs))
	}
	panels := map[string]bool{}
	last := ""
	for _, q := range qs {
		// Failures and the rendered image name panels by title: two panels must not share one.
		if q.Panel != last && panels[q.Panel] {
			t.Errorf("two panels titled %q", q.Panel)
		}
		last = q.Panel
		panels[q.Panel] = true
		if strings.Contains(q.Expr, "$") {
			t.Errorf("panel %q: unsubstituted variable in %q", q.Panel, q.Expr)
		}
	}
	for _, want := range []string{"Pending claims by namespace", "GPU memory vs quota", "GPU health",
		"GPUs held now vs needed at fgpu's sizes", "GPU memory per namespace: held, used (p95), at fgpu's sizes"} {
		if !panels[want] {
			t.Errorf("panel %q missing", want)
		}
	}
	if got := Substitute(`x{a="$namespace",b="${node}",c="$other"}`, map[string]string{"namespace": "n", "node": "m"}); got != `x{a="n",b="m",c="$other"}` {
		t.Errorf("Substitute: %s", got)
	}
}
