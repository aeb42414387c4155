package serve

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rampart-fw/rampart/internal/stats"
)

// collector reads the engine on every scrape: counters are the kernel's
// (carried across swaps by the engine), never a copy that could lag or
// reset. No label holds an address or a port.
type collector struct{ d *Daemon }

var (
	ruleLabels     = []string{"rule", "action", "iface", "direction"}
	descPackets    = prometheus.NewDesc("rampart_rule_packets_total", "Packets that took a rule's verdict (slots default, unparsed, malformed and non-ip too), since the policy was first applied on the hook.", ruleLabels, nil)
	descBytes      = prometheus.NewDesc("rampart_rule_bytes_total", "Bytes of the packets that took a rule's verdict.", ruleLabels, nil)
	descOver       = prometheus.NewDesc("rampart_limit_over_total", "Packets over a limit rule's rate (dropped by it).", ruleLabels, nil)
	descCookies    = prometheus.NewDesc("rampart_syncookies_total", "SYN cookies sent, and ACKs that carried a valid or an invalid one.", append(ruleLabels, "event"), nil)
	descListSize   = prometheus.NewDesc("rampart_list_entries", "Ranges of a list after merging, by family.", []string{"list", "family"}, nil)
	descGeneration = prometheus.NewDesc("rampart_policy_generation", "Generation of the policy the service applied last.", nil, nil)
	descReloads    = prometheus.NewDesc("rampart_reloads_total", "Reloads of the policy by result.", []string{"result"}, nil)
	descLastReload = prometheus.NewDesc("rampart_last_reload_timestamp_seconds", "When the policy was last (re)loaded.", nil, nil)
	descLastOK     = prometheus.NewDesc("rampart_last_reload_success", "1 if the last reload applied, 0 if it failed and the previous policy runs.", nil, nil)
	descMode       = prometheus.NewDesc("rampart_attached", "A hook rampart runs on: 1 if its program is attached.", []string{"iface", "direction", "mode"}, nil)
	descMemory     = prometheus.NewDesc("rampart_table_memory_bytes", "Memory the kernel accounts to the BPF maps of the policy generation a hook runs: its tables, rules and counters, and the outer maps holding them (hooks applied together share them: each counts them).", []string{"iface", "direction"}, nil)
	descAPIRefused = prometheus.NewDesc("rampart_api_refused_total", "API requests refused (403): the client was neither root nor in --api-group.", nil, nil)
	descCSActive   = prometheus.NewDesc("rampart_crowdsec_decisions", "CrowdSec decisions active in the service's set, by origin and type (types not enforced are counted, not listed).", []string{"origin", "type"}, nil)
	descCSPolls    = prometheus.NewDesc("rampart_crowdsec_polls_total", "Polls of the CrowdSec decision stream, by result.", []string{"result"}, nil)
	descCSErrors   = prometheus.NewDesc("rampart_crowdsec_lapi_errors_total", "Failed polls of the CrowdSec LAPI by reason (connect, status, auth, too-large, decode); the decisions enforced stay.", []string{"reason"}, nil)
	descCSRefused  = prometheus.NewDesc("rampart_crowdsec_decisions_refused_total", "Decisions of an answer that were not kept, by reason (scope, origin, value, duration, incomplete).", []string{"reason"}, nil)
	descCSDeltas   = prometheus.NewDesc("rampart_crowdsec_deltas_applied_total", "Answers of the decision stream that changed the set, applied.", nil, nil)
	descCSPackets  = prometheus.NewDesc("rampart_crowdsec_packets_total", "Packets that took the verdict of a rule over the CrowdSec list, by the origin of the decisions that matched (each origin has a list of its own).", []string{"origin", "action"}, nil)
	descCSBytes    = prometheus.NewDesc("rampart_crowdsec_bytes_total", "Bytes of those packets.", []string{"origin", "action"}, nil)
	descCSSync     = prometheus.NewDesc("rampart_crowdsec_last_sync_timestamp_seconds", "When the LAPI last answered a poll.", nil, nil)
	descScrapeErr  = prometheus.NewDesc("rampart_scrape_errors", "Errors reading the engine during this scrape.", nil, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	errs := 0
	snap, err := d.fw.Stats()
	if err != nil {
		errs++
		d.log.Error("metrics: counters", "err", err)
	}
	for _, r := range snap.Rows {
		l := []string{r.Name, r.Action, r.Iface, r.Direction}
		ch <- prometheus.MustNewConstMetric(descPackets, prometheus.CounterValue, float64(r.Packets), l...)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(r.Bytes), l...)
		if r.Kind == "rule" && r.Action == "limit" {
			ch <- prometheus.MustNewConstMetric(descOver, prometheus.CounterValue, float64(r.Over), l...)
		}
		if r.Kind == "rule" && r.Action == "syncookie" {
			ch <- prometheus.MustNewConstMetric(descCookies, prometheus.CounterValue, float64(r.CookiesSent), append(l, "sent")...)
			ch <- prometheus.MustNewConstMetric(descCookies, prometheus.CounterValue, float64(r.CookiesOK), append(l, "valid")...)
			ch <- prometheus.MustNewConstMetric(descCookies, prometheus.CounterValue, float64(r.CookiesBad), append(l, "invalid")...)
		}
	}
	hooks, err := d.fw.Status()
	if err != nil {
		errs++
		d.log.Error("metrics: status", "err", err)
	}
	for _, h := range hooks {
		ch <- prometheus.MustNewConstMetric(descMode, prometheus.GaugeValue, boolf(h.Attached), h.Iface, h.Direction, string(h.Mode))
		if h.TableBytes > 0 {
			ch <- prometheus.MustNewConstMetric(descMemory, prometheus.GaugeValue, float64(h.TableBytes), h.Iface, h.Direction)
		}
	}
	d.shown.Lock()
	sizes, generation, ok, failed, last, lastOK := d.listSizes, d.generation, d.reloads[true], d.reloads[false], d.lastReload, d.lastOK
	d.shown.Unlock()
	for name, n := range sizes {
		ch <- prometheus.MustNewConstMetric(descListSize, prometheus.GaugeValue, float64(n[0]), name, "4")
		ch <- prometheus.MustNewConstMetric(descListSize, prometheus.GaugeValue, float64(n[1]), name, "6")
	}
	ch <- prometheus.MustNewConstMetric(descGeneration, prometheus.GaugeValue, float64(generation))
	ch <- prometheus.MustNewConstMetric(descReloads, prometheus.CounterValue, float64(ok), "success")
	ch <- prometheus.MustNewConstMetric(descReloads, prometheus.CounterValue, float64(failed), "failure")
	ch <- prometheus.MustNewConstMetric(descLastReload, prometheus.GaugeValue, float64(last.UnixNano())/float64(time.Second))
	ch <- prometheus.MustNewConstMetric(descLastOK, prometheus.GaugeValue, boolf(lastOK))
	ch <- prometheus.MustNewConstMetric(descAPIRefused, prometheus.CounterValue, float64(d.apiRefused.Load()))
	d.cs.collect(ch, snap.Rows)
	d.fs.collect(ch, snap.Rows)
	ch <- prometheus.MustNewConstMetric(descScrapeErr, prometheus.GaugeValue, float64(errs))
}

// collect reports the CrowdSec feed, when the policy has one, and what
// the rules over each origin's list counted.
func (f *feed) collect(ch chan<- prometheus.Metric, rows []stats.Row) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cfg == nil || f.set == nil {
		return
	}
	type key struct{ origin, action string }
	var sums = map[key][2]uint64{}
	for _, r := range rows {
		if o, ok := f.split.rules[r.Name]; ok && r.Kind == "rule" {
			k := key{o, r.Action}
			sums[k] = [2]uint64{sums[k][0] + r.Packets, sums[k][1] + r.Bytes}
		}
	}
	for k, v := range sums {
		ch <- prometheus.MustNewConstMetric(descCSPackets, prometheus.CounterValue, float64(v[0]), k.origin, k.action)
		ch <- prometheus.MustNewConstMetric(descCSBytes, prometheus.CounterValue, float64(v[1]), k.origin, k.action)
	}
	for k, n := range f.set.Counts() {
		ch <- prometheus.MustNewConstMetric(descCSActive, prometheus.GaugeValue, float64(n), k.Origin, k.Type)
	}
	for _, r := range []string{"ok", "error"} {
		ch <- prometheus.MustNewConstMetric(descCSPolls, prometheus.CounterValue, float64(f.polls[r]), r)
	}
	for _, r := range []string{"connect", "status", "auth", "too-large", "decode"} {
		ch <- prometheus.MustNewConstMetric(descCSErrors, prometheus.CounterValue, float64(f.errs[r]), r)
	}
	for r, n := range f.refused {
		ch <- prometheus.MustNewConstMetric(descCSRefused, prometheus.CounterValue, float64(n), r)
	}
	ch <- prometheus.MustNewConstMetric(descCSDeltas, prometheus.CounterValue, float64(f.deltas))
	if !f.lastSync.IsZero() {
		ch <- prometheus.MustNewConstMetric(descCSSync, prometheus.GaugeValue, float64(f.lastSync.UnixNano())/float64(time.Second))
	}
	f.applied.Collect(ch)
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// metricsHandler serves /metrics: rampart's collector and the Go and
// process collectors.
func (d *Daemon) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{d}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slogAdapter{d}}))
	return mux
}

type slogAdapter struct{ d *Daemon }

func (s slogAdapter) Println(v ...any) { s.d.log.Error("metrics", "err", v) }
