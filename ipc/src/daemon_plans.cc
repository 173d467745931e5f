// kilnctl plans (daemon_plans.h).
#include "daemon_plans.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <vector>

#include "json_text.h"
#include "kiln/fusion/plan_graph.h"

namespace kiln::ipc {

namespace {

// "12 s ago", "3 min ago", "2 h ago", "4 d ago".
std::string ago(std::int64_t then_ms, std::int64_t now_ms) {
  const std::int64_t s = std::max<std::int64_t>(0, (now_ms - then_ms) / 1000);
  if (s < 120) return fmt::format("{} s ago", s);
  if (s < 7200) return fmt::format("{} min ago", s / 60);
  if (s < 172800) return fmt::format("{} h ago", s / 3600);
  return fmt::format("{} d ago", s / 86400);
}

struct Row {
  fusion::PlanId id;
  fusion::PlanPin plan;
  fusion::PlanUsage usage;
};

std::string users(const fusion::PlanUsage& u, const std::function<std::string(std::uint32_t)>& job_of, bool json) {
  std::string out;
  for (std::uint32_t t : u.user_tags)
    out += (out.empty() ? "" : json ? "," : " ") + (json ? json_text(job_of(t)) : job_of(t));
  if (u.more_users && !json) out += " ...";
  return json ? "[" + out + "]" : (out.empty() ? "-" : out);
}

}  // namespace

Result<PlanListOptions> parse_plan_list(std::span<const std::string_view> words, bool json) {
  PlanListOptions o;
  o.json = json;
  for (const std::string_view w : words) {
    std::size_t n = 0;
    if (w == "hits") {
      o.sort = PlanListOptions::Sort::Hits;
    } else if (w == "recent") {
      o.sort = PlanListOptions::Sort::Recent;
    } else if (w == "id") {
      o.sort = PlanListOptions::Sort::Id;
    } else if (auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), n);
               ec == std::errc() && p == w.data() + w.size()) {
      o.limit = n;
    } else {
      return make_error(ErrorCode::Invalid, fmt::format("plans: '{}': expected hits, recent, id or a count", w));
    }
  }
  return o;
}

std::string list_plans(const fusion::ExecutionPlanStore& store, const PlanListOptions& options,
                       const std::function<std::string(std::uint32_t)>& job_of) {
  std::vector<Row> rows;
  for (const fusion::PlanId id : store.ids()) {
    fusion::PlanPin plan = store.plan(id);
    std::optional<fusion::PlanUsage> usage = store.usage(id);
    if (plan && usage) rows.push_back(Row{id, std::move(plan), std::move(*usage)});  // else: gone meanwhile
  }
  const std::size_t total = rows.size();
  auto order = [&](const Row& a, const Row& b) {
    switch (options.sort) {
      case PlanListOptions::Sort::Hits:
        if (a.usage.hits != b.usage.hits) return a.usage.hits > b.usage.hits;
        break;
      case PlanListOptions::Sort::Recent:
        if (a.usage.last_used_ms != b.usage.last_used_ms) return a.usage.last_used_ms > b.usage.last_used_ms;
        break;
      case PlanListOptions::Sort::Id: break;
    }
    return a.id < b.id;
  };
  const std::size_t shown = options.limit == 0 ? total : std::min(total, options.limit);
  std::partial_sort(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(shown), rows.end(), order);
  rows.resize(shown);
  const std::int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  if (options.json) {
    std::string out = fmt::format("{{\"plans\":{},\"evicted\":{},\"retired\":{},\"shown\":[", total, store.evicted(),
                                  store.retired());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out += fmt::format(
          "{}{{\"id\":{},\"ops\":{},\"score\":{},\"fusers\":{},\"hits\":{},\"last_used_ms\":{},\"created_by\":{},"
          "\"used_by\":{},\"more_users\":{}}}",
          i ? "," : "", r.id, r.plan->operations.size(), fusion::plan_score(*r.plan),
          json_text(fusion::plan_fusers(*r.plan)), r.usage.hits, r.usage.last_used_ms,
          json_text(job_of(r.usage.creator_tag)), users(r.usage, job_of, true), r.usage.more_users);
    }
    return out + "]}";
  }
  std::string out = fmt::format("{} plans ({} evicted, {} retired); {} shown, by {}\n", total, store.evicted(),
                                store.retired(), rows.size(),
                                options.sort == PlanListOptions::Sort::Hits     ? "hits"
                                : options.sort == PlanListOptions::Sort::Recent ? "last use"
                                                                                : "id");
  out += fmt::format("{:>6} {:>4} {:>7} {:>9} {:>12}  {:<16} {:<24} {}\n", "ID", "OPS", "SCORE", "HITS", "LAST USE",
                     "CREATED BY", "USED BY", "BLOCKS");
  for (const Row& r : rows)
    out += fmt::format("{:>6} {:>4} {:>7} {:>9} {:>12}  {:<16} {:<24} {}\n", r.id, r.plan->operations.size(),
                       fusion::plan_score(*r.plan), r.usage.hits, ago(r.usage.last_used_ms, now_ms),
                       job_of(r.usage.creator_tag), users(r.usage, job_of, false), fusion::plan_fusers(*r.plan));
  return out;
}

Result<std::string> show_plan(const fusion::ExecutionPlanStore& store, std::string_view id_text,
                              std::string_view format) {
  fusion::PlanId id = 0;
  const auto [p, ec] = std::from_chars(id_text.data(), id_text.data() + id_text.size(), id);
  if (id_text.empty() || ec != std::errc() || p != id_text.data() + id_text.size())
    return make_error(ErrorCode::Invalid, fmt::format("plans show: '{}' is not a plan id (kilnctl plans)", id_text));
  const fusion::PlanPin plan = store.plan(id);
  const std::optional<fusion::PlanUsage> usage = store.usage(id);
  if (!plan || !usage)
    return make_error(ErrorCode::InvalidHandle,
                      fmt::format("plans show: no plan {} in the store (evicted, retired or never made)", id));
  if (format == "dot") return fusion::plan_to_dot(id, *plan, &*usage);
  if (format == "text" || format.empty()) return fusion::plan_to_text(id, *plan);
  return make_error(ErrorCode::Invalid, fmt::format("plans show: format '{}': expected text or dot", format));
}

}  // namespace kiln::ipc
