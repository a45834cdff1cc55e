// Package promcheck runs the queries of a Grafana dashboard against a Prometheus HTTP API and
// says which fail or return nothing, and renders what they returned to a PNG: the e2e's check
// that every panel of fgpu's dashboard shows data from a real Prometheus.
package promcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"time"
)

// Query is one target of one panel.
type Query struct {
	Panel  string
	RefID  string
	Expr   string
	Legend string
	Unit   string
}

type dashboard struct {
	Panels []panel `json:"panels"`
}

type panel struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// LoadDashboard reads every query of every panel of a dashboard's JSON, rows' panels too,
// with vars substituted ($name and ${name}).
func LoadDashboard(path string, vars map[string]string) ([]Query, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, Query{Panel: p.Title, RefID: t.RefID, Expr: Substitute(t.Expr, vars), Legend: t.LegendFormat, Unit: p.FieldConfig.Defaults.Unit})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out, nil
}

var varRef = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)`)

// Substitute replaces Grafana's $name and ${name} with vars' values; others stay.
func Substitute(expr string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(expr, func(m string) string {
		sub := varRef.FindStringSubmatch(m)
		name := sub[1] + sub[2]
		if v, ok := vars[name]; ok {
			return v
		}
		return m
	})
}

// Client queries a Prometheus HTTP API.
type Client struct {
	URL  string // e.g. http://127.0.0.1:9090
	HTTP *http.Client
}

// Series is one series of a range query's result.
type Series struct {
	Labels map[string]string
	Times  []time.Time
	Values []float64
}

type apiResponse struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	} `json:"data"`
}

// Range runs a range query over [start, end] every step.
func (c Client) Range(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
	q := url.Values{"query": {expr}, "start": {unix(start)}, "end": {unix(end)}, "step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	r, err := c.get(ctx, "/api/v1/query_range", q)
	if err != nil {
		return nil, err
	}
	out := make([]Series, 0, len(r.Data.Result))
	for _, res := range r.Data.Result {
		s := Series{Labels: res.Metric}
		for _, v := range res.Values {
			t, val, err := point(v)
			if err != nil {
				return nil, err
			}
			s.Times, s.Values = append(s.Times, t), append(s.Values, val)
		}
		out = append(out, s)
	}
	return out, nil
}

// Instant runs an instant query and returns each series' value.
func (c Client) Instant(ctx context.Context, expr string) ([]Series, error) {
	r, err := c.get(ctx, "/api/v1/query", url.Values{"query": {expr}})
	if err != nil {
		return nil, err
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: result type %s, want vector", expr, r.Data.ResultType)
	}
	out := make([]Series, 0, len(r.Data.Result))
	for _, res := range r.Data.Result {
		t, v, err := point(res.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, Series{Labels: res.Metric, Times: []time.Time{t}, Values: []float64{v}})
	}
	return out, nil
}

func (c Client) get(ctx context.Context, path string, q url.Values) (*apiResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("query %q: HTTP %d: %.200s", q.Get("query"), resp.StatusCode, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %q: %s: %s", q.Get("query"), r.ErrorType, r.Error)
	}
	return &r, nil
}

func unix(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64) }

func point(v [2]any) (time.Time, float64, error) {
	ts, ok := v[0].(float64)
	s, ok2 := v[1].(string)
	if !ok || !ok2 {
		return time.Time{}, 0, fmt.Errorf("malformed sample %v", v)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return time.Time{}, 0, err
	}
	return time.UnixMilli(int64(ts * 1000)), f, nil
}

// Result is what one query returned over a time range.
type Result struct {
	Query
	Series []Series
	Err    error
}

// Check runs every query over [start, end] and returns the results; Failed lists those that
// errored or returned no series.
func Check(ctx context.Context, c Client, queries []Query, start, end time.Time, step time.Duration) []Result {
	out := make([]Result, len(queries))
	for i, q := range queries {
		s, err := c.Range(ctx, q.Expr, start, end, step)
		if err == nil && len(s) == 0 {
			err = fmt.Errorf("panel %q query %s %q returned no series", q.Panel, q.RefID, q.Expr)
		} else if err != nil {
			err = fmt.Errorf("panel %q query %s: %w", q.Panel, q.RefID, err)
		}
		out[i] = Result{Query: q, Series: s, Err: err}
	}
	return out
}

// Failed is the errors of the results that failed.
func Failed(results []Result) []error {
	var errs []error
	for _, r := range results {
		if r.Err != nil {
			errs = append(errs, r.Err)
		}
	}
	return errs
}
