// Tests of the memory plot: the SVG is well-formed (a small checker here, and Python's XML parser
// where python3 exists), text is escaped, curves land where the axes say, OOM markers appear
// exactly where asked, decimation keeps what matters, and inconsistent input is refused.
#include "gpumem/report/memory_plot.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace {

using gpumem::decimate;
using gpumem::memory_curve;
using gpumem::memory_plot_options;
using gpumem::memory_plot_svg;
using gpumem::segment_map;
using gpumem::segment_map_block;
using gpumem::segment_map_segment;
using state = segment_map_block::state_kind;

constexpr std::uint64_t MiB = std::uint64_t{1} << 20, GiB = std::uint64_t{1} << 30;

// --- A small XML well-formedness checker ---------------------------------------------------------

bool valid_entity(const std::string& doc, std::size_t amp) {
  const auto semi = doc.find(';', amp);
  if (semi == std::string::npos || semi - amp > 10) return false;
  const std::string name = doc.substr(amp + 1, semi - amp - 1);
  if (name == "amp" || name == "lt" || name == "gt" || name == "quot" || name == "apos")
    return true;
  if (name.size() < 2 || name[0] != '#') return false;
  const bool hex = name[1] == 'x';
  const std::string digits = name.substr(hex ? 2 : 1);
  return !digits.empty() && std::all_of(digits.begin(), digits.end(), [hex](char c) {
    return hex ? std::isxdigit(static_cast<unsigned char>(c)) != 0
               : std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
}

// Returns "" for a well-formed document with one root element, else what is wrong: tags balance,
// attribute values are quoted and hold no '<', every '&' starts an entity, no raw '>' in text, no
// text outside the root.
std::string xml_problem(const std::string& doc) {
  std::vector<std::string> open;
  bool root_seen = false;
  for (std::size_t i = 0; i < doc.size();) {
    const char c = doc[i];
    if (c == '<') {
      if (doc.compare(i, 4, "<!--") == 0) {
        const auto end = doc.find("-->", i);
        if (end == std::string::npos) return "unterminated comment";
        i = end + 3;
        continue;
      }
      std::size_t j = i + 1;
      char quote = 0;
      for (; j < doc.size(); ++j) {
        const char d = doc[j];
        if (quote != 0) {
          if (d == quote) quote = 0;
          if (d == '<') return "'<' in an attribute value at " + std::to_string(j);
          if (d == '&' && !valid_entity(doc, j)) return "bad entity at " + std::to_string(j);
        } else if (d == '"' || d == '\'') {
          quote = d;
        } else if (d == '<') {
          return "'<' inside a tag at " + std::to_string(j);
        } else if (d == '>') {
          break;
        }
      }
      if (j == doc.size()) return "unterminated tag at " + std::to_string(i);
      std::string tag = doc.substr(i + 1, j - i - 1);
      i = j + 1;
      if (tag.empty()) return "empty tag";
      if (tag[0] == '/') {
        const std::string name = tag.substr(1);
        if (open.empty() || open.back() != name) {
          return "</" + name + "> closes " + (open.empty() ? std::string("nothing") : open.back());
        }
        open.pop_back();
        continue;
      }
      const bool self_closing = tag.back() == '/';
      const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
      if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0]))) {
        return "bad element name in <" + tag + ">";
      }
      if (open.empty()) {
        if (root_seen) return "a second root element <" + name + ">";
        root_seen = true;
      }
      if (!self_closing) open.push_back(name);
      continue;
    }
    if (open.empty() && !std::isspace(static_cast<unsigned char>(c))) {
      return "text outside the root element at " + std::to_string(i);
    }
    if (c == '&' && !valid_entity(doc, i)) return "bad entity at " + std::to_string(i);
    if (c == '>') return "raw '>' in text at " + std::to_string(i);
    ++i;
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  if (!root_seen) return "no element";
  return "";
}

// --- Reading the SVG back ------------------------------------------------------------------------

// The start tag of the first element whose start tag contains `marker`.
std::string element_with(const std::string& svg, const std::string& marker) {
  const auto at = svg.find(marker);
  if (at == std::string::npos) return "";
  const auto begin = svg.rfind('<', at);
  return svg.substr(begin, svg.find('>', at) - begin + 1);
}

std::string attribute(const std::string& element, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const auto at = element.find(key);
  if (at == std::string::npos) return "";
  const auto begin = at + key.size();
  return element.substr(begin, element.find('"', begin) - begin);
}

double number_attribute(const std::string& element, const std::string& name) {
  return std::stod(attribute(element, name));
}

struct point {
  double x, y;
};

std::vector<point> points_of(const std::string& polyline) {
  std::vector<point> points;
  std::istringstream in(attribute(polyline, "points"));
  for (std::string pair; in >> pair;) {
    const auto comma = pair.find(',');
    points.push_back({std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1))});
  }
  return points;
}

struct area {
  double x, y, width, height;
};

area plot_area(const std::string& svg) {
  const std::string rect = element_with(svg, "class=\"plot-area\"");
  return {number_attribute(rect, "x"), number_attribute(rect, "y"), number_attribute(rect, "width"),
          number_attribute(rect, "height")};
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string trimmed(const std::string& s) {
  const auto end = s.find_last_not_of(" \t\r\n");
  return end == std::string::npos ? "" : s.substr(0, end + 1);
}

// Coordinates are written with one decimal.
constexpr double tolerance = 0.051;

// --- Inputs --------------------------------------------------------------------------------------

memory_curve known_curve(std::string label = "classic") {
  memory_curve c;
  c.label = std::move(label);
  c.event_index = {0, 10, 20, 30, 40};
  c.requested = {0, 1 * GiB / 2, 3 * GiB, 1 * GiB, 2 * GiB};
  c.allocated = {0, 1 * GiB, 7 * GiB / 2, 3 * GiB / 2, 5 * GiB / 2};
  c.reserved = {0, 1 * GiB, 4 * GiB, 2 * GiB, 3 * GiB};
  return c;
}

segment_map known_map(std::string label = "classic") {
  segment_map m;
  m.label = std::move(label);
  m.at_event_index = 20;
  segment_map_segment large{20 * MiB, false, {}};
  large.blocks = {{0, 5 * MiB, state::allocated},
                  {5 * MiB, 2 * MiB, state::allocated},  // merged with the one before
                  {7 * MiB, 1 * MiB, state::pending_free},
                  {8 * MiB, 12 * MiB, state::cached}};
  segment_map_segment small{2 * MiB, true, {}};
  small.blocks = {{0, 512 * 1024, state::allocated}, {512 * 1024, 1536 * 1024, state::cached}};
  segment_map_segment vmm{64 * MiB, false, {}};
  vmm.blocks = {{0, 32 * MiB, state::allocated}, {32 * MiB, 32 * MiB, state::unmapped}};
  m.segments = {large, small, vmm};
  return m;
}

memory_plot_options full_options() {
  memory_plot_options o;
  o.title = "resnet50 replay";
  o.device_memory = 8 * GiB;
  o.recorded_reserved_peak = 5 * GiB;
  return o;
}

// --- Tests ---------------------------------------------------------------------------------------

TEST(XmlChecker, RejectsBrokenDocuments) {
  EXPECT_EQ(xml_problem("<svg><g a=\"1\"/><text>x &amp; y</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg><g></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a < b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a & b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text a=\"x<y\"/></svg>"), "");
  EXPECT_NE(xml_problem("<svg></svg><svg></svg>"), "");
  EXPECT_NE(xml_problem("<svg>"), "");
}

TEST(MemoryPlot, IsOneWellFormedSvgElement) {
  memory_curve second = known_curve("policy:stitch");
  second.oom_event_index = 25;
  const std::string svg = memory_plot_svg(
      {known_curve(), second}, {known_map(), known_map("policy:stitch")}, full_options());
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(trimmed(svg).substr(trimmed(svg).size() - 6), "</svg>");
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("resnet50 replay"), std::string::npos);
  EXPECT_NE(svg.find("device memory 8.00 GiB"), std::string::npos);
  EXPECT_NE(svg.find("recorded peak reserved 5.00 GiB"), std::string::npos);
  // Both configurations' lines, requested once.
  EXPECT_EQ(count(svg, "class=\"reserved\""), 2u);
  EXPECT_EQ(count(svg, "class=\"allocated\""), 2u);
  EXPECT_EQ(count(svg, "class=\"requested\""), 1u);
  EXPECT_EQ(count(svg, "class=\"segment-map\""), 2u);
  EXPECT_EQ(count(svg, "class=\"segment\""), 6u);
}

TEST(MemoryPlot, WriteMemoryPlotWritesTheSameDocument) {
  std::ostringstream out;
  gpumem::write_memory_plot(out, {known_curve()}, {known_map()}, full_options());
  EXPECT_EQ(out.str(), memory_plot_svg({known_curve()}, {known_map()}, full_options()));
}

TEST(MemoryPlot, PythonXmlParserAcceptsIt) {
  if (std::system("python3 -c pass >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 is not available";
  }
  // Labels with everything XML cannot hold as is: markup characters, a control character, a
  // byte that is not UTF-8, and U+FFFF.
  memory_curve c = known_curve("a<b & \"c\" 'd' \x01 \xff \xef\xbf\xbf \xc3\xa9");
  c.oom_event_index = 35;
  memory_plot_options o = full_options();
  o.title = "<title> & \x1f";
  const std::string svg = memory_plot_svg({c}, {known_map(c.label)}, o);
  const auto path = std::filesystem::temp_directory_path() /
                    ("gpumem_memory_plot_" +
                     std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".svg");
  {
    std::ofstream file(path, std::ios::binary);
    file << svg;
  }
  const std::string command =
      "python3 -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' \"" +
      path.string() + "\"";
  const int status = std::system(command.c_str());
  std::filesystem::remove(path);
  EXPECT_EQ(status, 0) << "python's XML parser rejected the document";
}

TEST(MemoryPlot, EscapesText) {
  const std::string label = "a<b & \"c\">'d'";
  memory_plot_options o;
  o.title = "x<y>&z";
  const std::string svg = memory_plot_svg({known_curve(label)}, {known_map(label)}, o);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;&gt;&apos;d&apos;"), std::string::npos);
  EXPECT_NE(svg.find("x&lt;y&gt;&amp;z"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(svg.find("x<y"), std::string::npos);
}

TEST(MemoryPlot, ReplacesWhatXmlCannotHold) {
  EXPECT_EQ(gpumem::detail::xml_escaped("a\x01"
                                        "b"),
            "a\xef\xbf\xbd"
            "b");
  EXPECT_EQ(gpumem::detail::xml_escaped("\xc3\xa9\t"), "\xc3\xa9\t");  // é and a tab stay
  EXPECT_EQ(gpumem::detail::xml_escaped("\xc3"), "\xef\xbf\xbd");      // truncated
  EXPECT_EQ(gpumem::detail::xml_escaped("\xc0\xaf"), "\xef\xbf\xbd\xef\xbf\xbd");  // overlong
  EXPECT_EQ(gpumem::detail::xml_escaped("\xed\xa0\x80"),
            "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
}

TEST(MemoryPlot, CurvePointsFollowTheAxes) {
  const std::string svg = memory_plot_svg({known_curve()}, {}, {});
  const area a = plot_area(svg);
  ASSERT_GT(a.width, 100);
  ASSERT_GT(a.height, 100);
  // Reserved peaks at 4 GiB, a multiple of the 1 GiB tick step: the peak is the top of the plot.
  EXPECT_NE(svg.find(">4 GiB</text>"), std::string::npos);
  const auto reserved = points_of(element_with(svg, "class=\"reserved\" data-curve=\"0\""));
  ASSERT_EQ(reserved.size(), 5u);
  const double x[] = {0, 0.25, 0.5, 0.75, 1};
  const double y[] = {0, 0.25, 1, 0.5, 0.75};  // share of the 4 GiB range
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(reserved[i].x, a.x + x[i] * a.width, tolerance) << "point " << i;
    EXPECT_NEAR(reserved[i].y, a.y + a.height - y[i] * a.height, tolerance) << "point " << i;
  }
  EXPECT_NEAR(reserved[2].y, a.y, tolerance);  // the peak
  const auto requested = points_of(element_with(svg, "class=\"requested\""));
  ASSERT_EQ(requested.size(), 5u);
  EXPECT_NEAR(requested[2].y, a.y + a.height * 0.25, tolerance);  // 3 of 4 GiB
  const auto allocated = points_of(element_with(svg, "class=\"allocated\" data-curve=\"0\""));
  ASSERT_EQ(allocated.size(), 5u);
  EXPECT_NEAR(allocated[2].y, a.y + a.height * 0.125, tolerance);  // 3.5 of 4 GiB
}

TEST(MemoryPlot, ReferenceLinesWidenTheRange) {
  memory_plot_options o;
  o.device_memory = 8 * GiB;
  const std::string svg = memory_plot_svg({known_curve()}, {}, o);
  const area a = plot_area(svg);
  const auto reserved = points_of(element_with(svg, "class=\"reserved\""));
  ASSERT_EQ(reserved.size(), 5u);
  EXPECT_NEAR(reserved[2].y, a.y + a.height / 2, tolerance);  // 4 of 8 GiB
  const std::string line = element_with(svg.substr(svg.find("class=\"device-memory\"")), "<line");
  EXPECT_NEAR(number_attribute(line, "y1"), a.y, tolerance);
  EXPECT_EQ(svg.find("recorded peak reserved"), std::string::npos);
}

TEST(MemoryPlot, OomMarkerExactlyWhereSet) {
  memory_curve first = known_curve("classic");
  memory_curve second = known_curve("policy:stitch");
  const std::string without = memory_plot_svg({first, second}, {}, {});
  EXPECT_EQ(count(without, "class=\"oom\""), 0u);
  EXPECT_EQ(without.find(">OOM<"), std::string::npos);

  second.oom_event_index = 25;  // halfway between 4 GiB (event 20) and 2 GiB (event 30)
  const std::string with = memory_plot_svg({first, second}, {}, {});
  EXPECT_EQ(xml_problem(with), "");
  ASSERT_EQ(count(with, "class=\"oom\""), 1u);
  EXPECT_NE(with.find("class=\"oom\" data-curve=\"1\""), std::string::npos);
  EXPECT_NE(with.find(">OOM<"), std::string::npos);
  EXPECT_NE(with.find("out of memory at event 25"), std::string::npos);
  const area a = plot_area(with);
  const std::string group = with.substr(with.find("class=\"oom\""));
  const std::string stroke = element_with(group, "<line");
  // The cross is centred on the reserved line at event 25.
  const double cx = (number_attribute(stroke, "x1") + number_attribute(stroke, "x2")) / 2;
  const double cy = (number_attribute(stroke, "y1") + number_attribute(stroke, "y2")) / 2;
  EXPECT_NEAR(cx, a.x + a.width * 25.0 / 40.0, 2 * tolerance);
  EXPECT_NEAR(cy, a.y + a.height * (1 - 3.0 / 4.0), 2 * tolerance);  // 3 of 4 GiB
}

TEST(MemoryPlot, SegmentBlocksAreDrawnToScale) {
  const std::string svg = memory_plot_svg({known_curve()}, {known_map()}, {});
  EXPECT_EQ(xml_problem(svg), "");
  // The two adjacent allocated blocks of the 20 MiB segment are one rectangle.
  EXPECT_NE(svg.find("<title>allocated 7.00 MiB in 2 blocks</title>"), std::string::npos);
  EXPECT_NE(svg.find("segment 20.00 MiB (large pool), 4 blocks"), std::string::npos);
  EXPECT_NE(svg.find("segment 2.00 MiB (small pool), 2 blocks"), std::string::npos);
  EXPECT_NE(svg.find("unmapped 32.00 MiB"), std::string::npos);
  const std::string first_segment = svg.substr(svg.find("class=\"segment\""));
  const std::string allocated = element_with(first_segment, "class=\"block allocated\"");
  const std::string pending = element_with(first_segment, "class=\"block pending-free\"");
  const std::string cached = element_with(first_segment, "class=\"block cached\"");
  const std::string outline = element_with(first_segment, "class=\"segment-outline\"");
  const double unit = number_attribute(outline, "width") / 20.0;  // pixels per MiB
  EXPECT_NEAR(number_attribute(allocated, "width"), 7 * unit, 0.02);
  EXPECT_NEAR(number_attribute(pending, "width"), 1 * unit, 0.02);
  EXPECT_NEAR(number_attribute(cached, "width"), 12 * unit, 0.02);
  EXPECT_NEAR(number_attribute(cached, "x"), number_attribute(outline, "x") + 8 * unit, 0.02);
  // The 64 MiB segment is drawn at the same scale.
  const std::string third = svg.substr(svg.find("segment 64.00 MiB"));
  const std::string third_outline = element_with(third, "class=\"segment-outline\"");
  EXPECT_NEAR(number_attribute(third_outline, "width"), 64 * unit, 0.05);
  EXPECT_NE(element_with(svg.substr(svg.find("segment 2.00 MiB")), "class=\"segment-outline\"")
                .find("stroke-dasharray"),
            std::string::npos);  // small pool: dashed
}

memory_curve noisy_curve(std::size_t n) {
  memory_curve c;
  c.label = "noisy";
  std::uint64_t seed = 12345;
  for (std::size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const std::uint64_t noise = (seed >> 33) % (64 * MiB);
    c.event_index.push_back(3 * i + 7);
    c.requested.push_back(1 * GiB + noise);
    c.allocated.push_back(1 * GiB + noise + noise / 8);
    c.reserved.push_back(2 * GiB + noise / 2);
  }
  // Lone spikes that decimation must not lose, in the middle of a bucket.
  c.reserved[n / 3 + 1] = 9 * GiB;
  c.allocated[n / 2 + 1] = 5 * GiB;
  c.requested[2 * n / 3 + 1] = 4 * GiB;
  c.reserved[n / 5 + 1] = 1;  // a trough
  return c;
}

TEST(Decimate, KeepsEndsExtremesAndTheOomSample) {
  memory_curve c = noisy_curve(100000);
  c.oom_event_index = c.event_index[77777] + 1;  // between two samples: both are kept
  const memory_curve d = decimate(c, 500);
  ASSERT_LE(d.event_index.size(), 500u);
  ASSERT_GE(d.event_index.size(), 100u);
  ASSERT_EQ(d.requested.size(), d.event_index.size());
  ASSERT_EQ(d.allocated.size(), d.event_index.size());
  ASSERT_EQ(d.reserved.size(), d.event_index.size());
  EXPECT_EQ(d.label, "noisy");
  EXPECT_EQ(d.oom_event_index, c.oom_event_index);
  EXPECT_EQ(d.event_index.front(), c.event_index.front());
  EXPECT_EQ(d.event_index.back(), c.event_index.back());
  EXPECT_TRUE(std::is_sorted(d.event_index.begin(), d.event_index.end()));
  for (const std::size_t i : {77777, 77778}) {
    EXPECT_NE(std::find(d.event_index.begin(), d.event_index.end(), c.event_index[i]),
              d.event_index.end())
        << "sample " << i;
  }
  // Every sample kept is an original one, all its values together.
  for (std::size_t k = 0; k < d.event_index.size(); ++k) {
    const std::size_t i = (d.event_index[k] - 7) / 3;
    ASSERT_EQ(c.event_index[i], d.event_index[k]);
    ASSERT_EQ(c.requested[i], d.requested[k]);
    ASSERT_EQ(c.allocated[i], d.allocated[k]);
    ASSERT_EQ(c.reserved[i], d.reserved[k]);
  }
  for (const auto member :
       {&memory_curve::requested, &memory_curve::allocated, &memory_curve::reserved}) {
    const auto& original = c.*member;
    const auto& kept = d.*member;
    EXPECT_EQ(*std::max_element(kept.begin(), kept.end()),
              *std::max_element(original.begin(), original.end()));
    EXPECT_EQ(*std::min_element(kept.begin(), kept.end()),
              *std::min_element(original.begin(), original.end()));
  }
  EXPECT_EQ(*std::max_element(d.reserved.begin(), d.reserved.end()), 9 * GiB);
  EXPECT_EQ(*std::min_element(d.reserved.begin(), d.reserved.end()), 1u);
}

TEST(Decimate, SmallCurvesAndEmptySeries) {
  const memory_curve c = known_curve();
  const memory_curve d = decimate(c, 10);
  EXPECT_EQ(d.event_index, c.event_index);
  EXPECT_EQ(d.reserved, c.reserved);
  memory_curve only_reserved = noisy_curve(1000);
  only_reserved.requested.clear();
  only_reserved.allocated.clear();
  const memory_curve r = decimate(only_reserved, 50);
  EXPECT_LE(r.event_index.size(), 50u);
  EXPECT_TRUE(r.requested.empty());
  EXPECT_TRUE(r.allocated.empty());
  EXPECT_EQ(r.reserved.size(), r.event_index.size());
  EXPECT_EQ(*std::max_element(r.reserved.begin(), r.reserved.end()), 9 * GiB);
  EXPECT_THROW(decimate(c, gpumem::min_decimated_points - 1), std::invalid_argument);
}

TEST(MemoryPlot, LongCurvesAreDecimatedWhenDrawn) {
  memory_curve c = noisy_curve(1000000);
  c.oom_event_index = c.event_index.back();
  const std::string svg = memory_plot_svg({c}, {}, {});
  EXPECT_LT(svg.size(), 300u * 1024) << "the plot of one curve should stay small";
  EXPECT_EQ(xml_problem(svg), "");
  const area a = plot_area(svg);
  const auto reserved = points_of(element_with(svg, "class=\"reserved\""));
  EXPECT_LE(reserved.size(), 2000u);
  EXPECT_GE(reserved.size(), 500u);
  // The 9 GiB spike survives: it is the top of a 10 GiB axis (ticks of 2 GiB).
  const auto top = std::min_element(reserved.begin(), reserved.end(),
                                    [](point p, point q) { return p.y < q.y; });
  EXPECT_NEAR(top->y, a.y + a.height * 0.1, tolerance);
  EXPECT_NEAR(reserved.front().x, a.x, tolerance);
  EXPECT_NEAR(reserved.back().x, a.x + a.width, tolerance);
}

TEST(MemoryPlot, RefusesInconsistentInput) {
  const auto plot = [](const std::vector<memory_curve>& curves,
                       const std::vector<segment_map>& maps, const memory_plot_options& o) {
    std::ostringstream out;
    try {
      gpumem::write_memory_plot(out, curves, maps, o);
    } catch (...) {
      EXPECT_TRUE(out.str().empty()) << "nothing is written when it throws";
      throw;
    }
  };
  EXPECT_NO_THROW(plot({known_curve()}, {known_map()}, {}));

  memory_curve short_series = known_curve();
  short_series.allocated.pop_back();
  EXPECT_THROW(plot({short_series}, {}, {}), std::invalid_argument);
  EXPECT_THROW(decimate(short_series, 100), std::invalid_argument);

  memory_curve backwards = known_curve();
  backwards.event_index[3] = 15;
  EXPECT_THROW(plot({known_curve(), backwards}, {}, {}), std::invalid_argument);
  EXPECT_THROW(decimate(backwards, 100), std::invalid_argument);

  memory_curve repeated = known_curve();  // equal indices are fine
  repeated.event_index[3] = 20;
  EXPECT_NO_THROW(plot({repeated}, {}, {}));

  segment_map beyond = known_map();
  beyond.segments[0].blocks.back().size += 1;
  EXPECT_THROW(plot({known_curve()}, {beyond}, {}), std::invalid_argument);

  segment_map overlapping = known_map();
  overlapping.segments[0].blocks[1].offset -= 1;
  EXPECT_THROW(plot({known_curve()}, {overlapping}, {}), std::invalid_argument);

  segment_map huge_block = known_map();
  huge_block.segments[0].blocks.back().offset = ~std::uint64_t{0};
  EXPECT_THROW(plot({known_curve()}, {huge_block}, {}), std::invalid_argument);

  memory_plot_options narrow;
  narrow.width = 100;
  EXPECT_THROW(plot({known_curve()}, {}, narrow), std::invalid_argument);

  memory_plot_options few_points;
  few_points.max_points_per_line = 3;
  EXPECT_THROW(plot({known_curve()}, {}, few_points), std::invalid_argument);
}

TEST(MemoryPlot, EmptyInputStillMakesADocument) {
  const std::string svg = memory_plot_svg({}, {}, {});
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "<polyline"), 0u);
  memory_curve empty;
  empty.label = "nothing yet";
  const std::string one = memory_plot_svg({empty}, {segment_map{"nothing yet", 0, {}}}, {});
  EXPECT_EQ(xml_problem(one), "");
  EXPECT_NE(one.find("(no segments)"), std::string::npos);
}

}  // namespace
