// wanprobe pictures: draws the chart specs of a page with BokehJS (bokeh.min.js + bokeh-api.min.js,
// shipped in the bokeh wheel, https://docs.bokeh.org/en/latest/docs/user_guide/advanced/bokehjs.html).
// The page carries its data as one JSON document (<script type="application/json"
// id="wanprobe-charts">); nothing here builds HTML from data: titles and labels are drawn on the
// canvas, and tooltips show field values, which BokehJS escapes.
(function () {
  "use strict";
  const P = Bokeh.Plotting;
  const LOSS_BINS = [  // smokeping colours the median by loss; here markers on the p50 line
    [0.0, 0.01, "#f1c232", "loss < 1 %"],
    [0.01, 0.05, "#e69138", "loss 1-5 %"],
    [0.05, Infinity, "#cc0000", "loss >= 5 %"],
  ];
  const STREAM_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                          "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  function plain(text) {
    // a string title is parsed for TeX delimiters ($$...$$) and would load MathJax from a CDN;
    // names come from config files and peers: always plain text
    return new Bokeh.Title({text: new Bokeh.PlainText({text: text || ""})});
  }

  function fig(spec, extra) {
    const f = P.figure(Object.assign({
      height: spec.height || 260, sizing_mode: "stretch_width", title: plain(spec.title),
      tools: "xpan,xwheel_zoom,box_zoom,reset,save", toolbar_location: "right",
      x_axis_label: spec.x_label || "", y_axis_label: spec.y_label || "",
    }, extra || {}));
    f.toolbar.logo = null;
    return f;
  }

  function hover(f, renderers, tooltips, datetime) {
    const formatters = datetime ? {"@x": "datetime"} : {};
    f.add_tools(new Bokeh.HoverTool({renderers: renderers, tooltips: tooltips,
                                     formatters: formatters}));
  }

  function legendTopLeft(f) {
    if (f.legend && f.legend.length !== undefined) {
      for (const l of f.legend) { l.location = "top_left"; l.click_policy = "hide"; }
    } else if (f.legend) {
      f.legend.location = "top_left";
      f.legend.click_policy = "hide";
    }
  }

  function marks(f, items, y, colour, marker, label) {
    // vertical lines across the plot, and a marker at the top carrying the label in its tooltip
    if (!items.length) { return; }
    for (const it of items) {
      f.add_layout(new Bokeh.Span({location: it.x, dimension: "height", line_color: colour,
                                   line_dash: "dashed", line_width: 1.5}));
    }
    const src = new Bokeh.ColumnDataSource({data: {
      x: items.map((it) => it.x), y: items.map(() => y), label: items.map((it) => it.label)}});
    const r = f.scatter({x: {field: "x"}, y: {field: "y"}, source: src, marker: marker, size: 11,
                         fill_color: colour, line_color: colour, legend_label: label});
    hover(f, [r], [["time (UTC)", "@x{%F %T}"], [label, "@label"]], true);
  }

  function gaps(cols) {
    // JSON has no NaN; BokehJS breaks a line or an area at NaN (a null would be drawn as 0)
    const out = {};
    for (const k of Object.keys(cols)) {
      out[k] = cols[k].map((v) => (v === null ? NaN : v));
    }
    return out;
  }

  function xRange(f, spec) {
    if (spec.x_start !== undefined && spec.x_end !== undefined) {
      f.x_range = new Bokeh.Range1d({start: spec.x_start, end: spec.x_end});
    }
  }

  function band(spec) {
    const d = gaps(spec.data);
    const f = fig(spec, {x_axis_type: "datetime"});
    const src = new Bokeh.ColumnDataSource({data: d});
    f.varea({x: {field: "x"}, y1: {field: "min"}, y2: {field: "p99"}, source: src,
             fill_color: "#9ecae1", fill_alpha: 0.55, legend_label: "min to p99"});
    const med = f.line({x: {field: "x"}, y: {field: "p50"}, source: src, line_color: "#08519c",
                        line_width: 2, legend_label: "p50"});
    hover(f, [med], [["time (UTC)", "@x{%F %T}"], ["min ms", "@min{0.000}"],
                     ["p50 ms", "@p50{0.000}"], ["p99 ms", "@p99{0.000}"],
                     ["loss", "@loss{0.00%}"], ["forward", "@fwd{0.00%}"],
                     ["reverse", "@rev{0.00%}"], ["sessions", "@sessions"]], true);
    for (const [lo, hi, colour, label] of LOSS_BINS) {
      const keep = [];
      d.loss.forEach((v, i) => { if (v > 0 && v >= lo && v < hi) { keep.push(i); } });
      if (!keep.length) { continue; }
      const sub = {};
      for (const k of Object.keys(d)) { sub[k] = keep.map((i) => d[k][i]); }
      const r = f.scatter({x: {field: "x"}, y: {field: "p50"}, source: new Bokeh.ColumnDataSource({data: sub}),
                           marker: "circle", size: 6, fill_color: colour, line_color: colour,
                           legend_label: label});
      hover(f, [r], [["time (UTC)", "@x{%F %T}"], ["loss", "@loss{0.00%}"],
                     ["forward", "@fwd{0.00%}"], ["reverse", "@rev{0.00%}"]], true);
    }
    const top = spec.y_top;
    marks(f, spec.events || [], top, "#d62728", "inverted_triangle", "path event");
    marks(f, spec.changes || [], top * 0.97, "#2ca02c", "diamond", "tuning change");
    xRange(f, spec);
    legendTopLeft(f);
    return f;
  }

  function lines(spec) {
    const f = fig(spec, spec.datetime ? {x_axis_type: "datetime"} : {});
    const rs = [];
    spec.series.forEach((s, i) => {
      const src = new Bokeh.ColumnDataSource({data: gaps({x: s.x, y: s.y})});
      const colour = STREAM_COLOURS[i % STREAM_COLOURS.length];
      rs.push(f.line({x: {field: "x"}, y: {field: "y"}, source: src, line_color: colour,
                      line_width: s.width || 1.5, legend_label: s.name}));
      if (s.points) {
        f.scatter({x: {field: "x"}, y: {field: "y"}, source: src, size: 6, fill_color: colour,
                   line_color: colour, legend_label: s.name});
      }
    });
    hover(f, rs, [[spec.x_label || "x", spec.datetime ? "@x{%F %T}" : "@x{0.0}"],
                  [spec.y_label || "y", "@y{0.00}"]], !!spec.datetime);
    xRange(f, spec);
    legendTopLeft(f);
    return f;
  }

  function hist(spec) {
    const f = fig(spec, {tools: "xpan,xwheel_zoom,box_zoom,reset,save"});
    const src = new Bokeh.ColumnDataSource({data: {left: spec.left, right: spec.right,
                                                  count: spec.count}});
    const r = f.quad({left: {field: "left"}, right: {field: "right"}, bottom: 0,
                      top: {field: "count"}, source: src, fill_color: "#6baed6",
                      line_color: "#08519c"});
    hover(f, [r], [["from ms", "@left{0.000}"], ["to ms", "@right{0.000}"],
                   ["probes", "@count"]], false);
    for (const m of spec.marks || []) {
      f.add_layout(new Bokeh.Span({location: m.x, dimension: "height", line_color: "#d62728",
                                   line_dash: "dashed"}));
      f.add_layout(new Bokeh.Label({x: m.x, y: 0, y_offset: 4, x_offset: 3, text: m.label,
                                    text_font_size: "11px", text_color: "#d62728"}));
    }
    return f;
  }

  function bars(spec) {
    const f = fig(spec, {x_range: new Bokeh.FactorRange({factors: spec.labels}),
                         tools: "save"});
    const src = new Bokeh.ColumnDataSource({data: {x: spec.labels, y: spec.values,
                                                  note: spec.notes}});
    const r = f.vbar({x: {field: "x"}, top: {field: "y"}, width: 0.6, source: src,
                      fill_color: "#74c476", line_color: "#238b45"});
    f.y_range.start = 0;
    hover(f, [r], [["", "@x"], [spec.y_label || "value", "@y{0.00}"], ["", "@note"]], false);
    return f;
  }

  const KINDS = {band: band, lines: lines, hist: hist, bars: bars};
  Bokeh.set_log_level("warn");
  const specs = JSON.parse(document.getElementById("wanprobe-charts").textContent);
  let shown = 0;
  for (const spec of specs) {
    const draw = KINDS[spec.kind];
    const target = document.getElementById(spec.target);
    if (!draw || !target) { continue; }
    P.show(draw(spec), target);
    shown += 1;
  }
  document.body.setAttribute("data-charts", String(shown));
})();
