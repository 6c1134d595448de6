// Checkpoint-aware coding (doc/container.md section 12), within one file:
// the element-wise predictors of src/codec/predict.h, cast prediction in
// .tzip files, hostile version-2 headers, and the real step200 -> step400
// fixture pair. Across files and checkpoints: test_predict_checkpoints.cpp;
// compress_checkpoint's all-or-nothing outputs: test_predict_all_or_none.cpp.

#include "predict_fixture.hpp"

using namespace predict_test;

// ---- element-wise predictors (host side of the TZ_HD code) -----------------

TEST(PredictH, Bf16RneMatchesIndependentReference) {
  std::vector<uint32_t> xs = {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F8000u,
                              0x00000001u, 0x80000001u, 0x007FFFFFu, 0x00008000u, 0x00018000u, 0x3F808000u,
                              0x3F818000u, 0x3F807FFFu, 0x3F808001u};
  for (uint64_t x = 0; x < (1ull << 32); x += 65521) xs.push_back((uint32_t)x);
  std::mt19937 g(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t hi = g() & 0xFFFF0000u;
    xs.push_back(hi | 0x8000u);  // exact ties
    xs.push_back(hi | (g() & 0xFFFF));
  }
  for (uint32_t x : xs) {
    if (std::isnan(u2f(x))) continue;
    ASSERT_EQ(tp::f32_to_bf16_rne(x), bf16_reference(x)) << std::hex << x;
  }
  // Overflow of the largest finite values rounds to infinity, as RNE must.
  EXPECT_EQ(tp::f32_to_bf16_rne(0x7F7FFFFFu), 0x7F80u);
  EXPECT_EQ(tp::f32_to_bf16_rne(0x80000000u), 0x8000u);  // -0 stays -0
  // Every NaN (either sign, any payload, signalling or quiet) -> 0x7FC0.
  for (uint32_t n : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F810000u})
    EXPECT_EQ(tp::f32_to_bf16_rne(n), 0x7FC0u) << std::hex << n;
}

#if defined(__FLT16_MAX__)
TEST(PredictH, F16RneMatchesCompilerConversion) {
  auto check = [](uint32_t x) {
    const float f = u2f(x);
    if (std::isnan(f)) return;
    const _Float16 h = (_Float16)f;
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(tp::f32_to_f16_rne(x), hb) << std::hex << x;
  };
  for (uint64_t x = 0; x < (1ull << 32); x += 4099) check((uint32_t)x);
  // Around every binary16 boundary: subnormals, the normal range, overflow.
  for (uint32_t e = 100; e <= 144; ++e)
    for (uint32_t m : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FFFFFu, 0x400000u, 0x3FFFFFu, 0x401000u})
      for (uint32_t s : {0u, 0x80000000u}) check(s | (e << 23) | m);
  EXPECT_EQ(tp::f32_to_f16_rne(f2u(65504.f)), 0x7BFFu);
  EXPECT_EQ(tp::f32_to_f16_rne(f2u(65520.f)), 0x7C00u);
  EXPECT_EQ(tp::f32_to_f16_rne(0xFFC00001u), 0xFE00u);  // NaN keeps its sign, payload dropped
}
#endif

TEST(PredictH, XorAndCastXorAreInvolutions) {
  const Bytes f = normal_f32(1001, 0.02f, 3);
  Bytes v = cast_of(f, tp::kCastBF16), orig = v;
  v[10] ^= 0x5A;
  const Bytes actual = v;
  tp::cast_xor(f.data(), v.data(), 1001, tp::kCastBF16);  // -> residual
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], i == 10 ? 0x5A : 0) << i;
  tp::cast_xor(f.data(), v.data(), 1001, tp::kCastBF16);  // -> value
  EXPECT_EQ(v, actual);
  Bytes a = f, b = normal_f32(1001, 0.02f, 4);
  tp::xor_bytes(b.data(), a.data(), a.size());
  tp::xor_bytes(b.data(), a.data(), a.size());
  EXPECT_EQ(a, f);
}

// ---- cast prediction inside one file ---------------------------------------

TEST_F(Predict, CastWithinFileExactAndInexactRoundTrip) {
  const size_t n = 700000;  // 2.8 MB FP32: several 1 MiB frames
  const Bytes master = normal_f32(n, 0.02f, 1);
  Bytes master2 = normal_f32(n, 0.05f, 2);
  Bytes w_exact = cast_of(master, tp::kCastBF16);
  Bytes w_inexact = cast_of(master2, tp::kCastBF16);
  Bytes h16 = cast_of(master, tp::kCastF16);
  // Perturbed masters: flip low mantissa bits of the master after the cast
  // (the cast result usually stays, sometimes changes) and some BF16 values
  // directly, so the prediction is wrong in a few places.
  std::mt19937 g(9);
  for (int k = 0; k < 500; ++k) master2[4 * (g() % n) + 1] ^= (uint8_t)(1u << (g() % 8));
  for (int k = 0; k < 300; ++k) w_inexact[2 * (g() % n)] ^= 1;
  const std::string shape = "[" + std::to_string(n) + "]";
  // Names differ from the sources: discovery matches by value, not by name.
  write_st(p("a.safetensors"), {{"weight_b", "BF16", shape, w_inexact},
                                {"weight_a", "BF16", shape, w_exact},
                                {"half", "F16", shape, h16},
                                {"opt.m1", "F32", shape, master},
                                {"opt.m2", "F32", shape, master2},
                                {"unrelated", "BF16", shape, cast_of(normal_f32(n, 0.02f, 77), tp::kCastBF16)}});
  tc::WriteOptions o;
  o.chunk_bytes = 1u << 20;
  o.threads = 3;
  tc::compress_file(p("a.safetensors"), p("a.tzip"), o);
  tc::Reader r(p("a.tzip"));
  EXPECT_EQ(r.version_major(), 2);
  EXPECT_EQ(preamble_major(p("a.tzip")), 2);
  EXPECT_TRUE(r.references().empty());
  const auto& wa = entry(r, "weight_a");
  EXPECT_EQ(wa.predict.kind, tc::PredictKind::kCast);
  EXPECT_EQ(wa.predict.source, "opt.m1");
  EXPECT_EQ(wa.predict.ref, -1);
  // Exact prediction: every residual chunk is all zero, stored as size-0 frames.
  EXPECT_EQ(wa.compressed_size(), 0u);
  ASSERT_EQ(wa.frames.size(), 2u);  // 1.4 MB in 1 MiB chunks
  for (const auto& f : wa.frames) EXPECT_EQ(f.size, 0u);
  const auto& wb = entry(r, "weight_b");
  EXPECT_EQ(wb.predict.kind, tc::PredictKind::kCast);
  EXPECT_EQ(wb.predict.source, "opt.m2");
  EXPECT_LT(wb.compressed_size(), wb.raw_size() / 20);  // ~800 exceptions cost only their own bits
  EXPECT_GT(wb.compressed_size(), 0u);
  EXPECT_EQ(entry(r, "half").predict.kind, tc::PredictKind::kCast);
  EXPECT_EQ(entry(r, "unrelated").predict.kind, tc::PredictKind::kNone);
  EXPECT_EQ(entry(r, "opt.m1").predict.kind, tc::PredictKind::kNone);
  roundtrip(p("a.tzip"), p("a.safetensors"));
  r.verify(p("a.safetensors"), tc::ReadOptions{});

  // Random access of a predicted tensor: whole, block ranges, byte ranges
  // spanning frames.
  const Bytes orig = read_all(p("a.safetensors"));
  const tc::SafetensorsInfo st = tc::read_safetensors_info(p("a.safetensors"));
  for (const char* name : {"weight_a", "weight_b", "half"}) {
    const long i = r.find(name);
    const auto& t = r.tensors()[(size_t)i];
    const Bytes want(orig.begin() + (long)(st.data_start + t.data_begin), orig.begin() + (long)(st.data_start + t.data_end));
    EXPECT_EQ(r.read_tensor(name), want) << name;
    for (auto [off, len] : {std::pair<uint64_t, uint64_t>{0, 10}, {131071, 3}, {(1u << 20) - 5, 17}, {t.raw_size() - 7, 7}}) {
      Bytes got(len);
      r.read_range((size_t)i, off, len, got.data());
      EXPECT_EQ(got, Bytes(want.begin() + (long)off, want.begin() + (long)(off + len))) << name << " " << off;
    }
    Bytes blk(2 * t.block_bytes());
    const size_t w = r.read_blocks((size_t)i, 3, 2, blk.data(), blk.size());
    ASSERT_EQ(w, blk.size());
    EXPECT_EQ(blk, Bytes(want.begin() + (long)(3 * t.block_bytes()), want.begin() + (long)(5 * t.block_bytes())));
  }

  // --no-predict: plain version-1 file, larger, same content.
  o.predict = false;
  tc::compress_file(p("a.safetensors"), p("plain.tzip"), o);
  EXPECT_EQ(preamble_major(p("plain.tzip")), 1);
  EXPECT_GT(read_all(p("plain.tzip")).size(), read_all(p("a.tzip")).size() * 12 / 10);
  roundtrip(p("plain.tzip"), p("a.safetensors"));
}

TEST_F(Predict, SpecialValuesInMasters) {
  // NaN (payloads, both signs), infinities, -0, subnormals, values that
  // overflow BF16/F16, ties; BF16 from the RNE rule, plus a second BF16
  // whose NaNs keep their sign (what a different framework might write):
  // those elements are exceptions and must still round-trip.
  std::vector<uint32_t> sp = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFA00000u, 0x7F800000u, 0xFF800000u,
                              0x80000000u, 0x00000000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0x477FF000u,
                              0x477FEFFFu, 0x33000000u, 0x33000001u, 0x3F808000u, 0x3F818000u, 0xC7800000u};
  Bytes master = normal_f32(65536, 1.0f, 5);
  for (size_t i = 0; i < 65536; i += 37) {
    const uint32_t v = sp[(i / 37) % sp.size()];
    std::memcpy(&master[4 * i], &v, 4);
  }
  Bytes bf = cast_of(master, tp::kCastBF16), bf_signed = bf, h16 = cast_of(master, tp::kCastF16);
  for (size_t i = 0; i < 65536; ++i) {
    uint32_t u;
    std::memcpy(&u, &master[4 * i], 4);
    if (std::isnan(u2f(u))) {
      const uint16_t s = (uint16_t)((u >> 16) | 0x0040);
      std::memcpy(&bf_signed[2 * i], &s, 2);
    }
  }
  write_st(p("s.safetensors"), {{"m", "F32", "[256,256]", master},
                                {"b", "BF16", "[256,256]", bf},
                                {"bs", "BF16", "[256,256]", bf_signed},
                                {"h", "F16", "[256,256]", h16}});
  tc::compress_file(p("s.safetensors"), p("s.tzip"), tc::WriteOptions{});
  tc::Reader r(p("s.tzip"));
  for (const char* n : {"b", "bs", "h"}) EXPECT_EQ(entry(r, n).predict.kind, tc::PredictKind::kCast) << n;
  roundtrip(p("s.tzip"), p("s.safetensors"));
}

// ---- hostile version-2 headers ---------------------------------------------

// with_header (tests/support/tz_test_tzip_edit.hpp) rewrites the JSON header and
// fixes every checksum, so that the header validation itself must catch the edit.

TEST_F(Predict, HeaderValidationOfPredictions) {
  const Bytes m = normal_f32(4096, 0.02f, 41);
  write_st(p("h.safetensors"), {{"w", "BF16", "[64,64]", cast_of(m, tp::kCastBF16)},
                                {"m", "F32", "[64,64]", m},
                                {"v", "F32", "[64,64]", normal_f32(4096, 1.f, 42)}});
  tc::compress_file(p("h.safetensors"), p("h.tzip"), tc::WriteOptions{});
  tc::WriteOptions plain;
  plain.predict = false;
  tc::compress_file(p("h.safetensors"), p("h1.tzip"), plain);
  const Bytes good = read_all(p("h.tzip")), v1 = read_all(p("h1.tzip"));
  write_all(p("same.tzip"), with_header(good, [](nlohmann::json&) {}));
  ASSERT_NO_THROW(tc::Reader(p("same.tzip")).verify(p("h.safetensors"), tc::ReadOptions{}));
  using J = nlohmann::json;
  auto w = [](J& j) -> J& { return j["tensors"][0]; };  // "w", the cast
  const std::vector<std::tuple<const char*, const Bytes*, std::function<void(J&)>>> edits = {
      {"predict in a version 1 file", &v1, [&](J& j) { w(j)["predict"] = {{"kind", "cast"}, {"source", "m"}}; }},
      {"references in a version 1 file", &v1, [](J& j) { j["references"] = J::array(); }},
      {"references missing", &good, [](J& j) { j.erase("references"); }},
      {"json version 1 in a 2.0 file", &good, [](J& j) { j["version"] = 1; }},
      {"unknown kind", &good, [&](J& j) { w(j)["predict"]["kind"] = "lerp"; }},
      {"unknown key", &good, [&](J& j) { w(j)["predict"]["scale"] = 2; }},
      {"ref out of range", &good, [&](J& j) { w(j)["predict"]["ref"] = 0; }},
      {"delta without ref", &good, [&](J& j) { w(j)["predict"] = {{"kind", "delta"}}; }},
      {"source missing", &good, [&](J& j) { w(j)["predict"]["source"] = "nope"; }},
      {"source empty", &good, [&](J& j) { w(j)["predict"]["source"] = ""; }},
      {"source is the tensor itself", &good, [&](J& j) { w(j)["predict"]["source"] = "w"; }},
      {"cast of an F32 tensor", &good, [](J& j) { j["tensors"][1]["predict"] = {{"kind", "cast"}, {"source", "v"}}; }},
      {"reference without checksum", &good, [](J& j) { j["references"] = J::array({{{"file", "x.tzip"}}}); }},
      {"reference bad checksum", &good,
       [](J& j) { j["references"] = J::array({{{"file", "x.tzip"}, {"xxh64", "XYZ"}}}); }},
      {"reference without name", &good,
       [](J& j) { j["references"] = J::array({{{"file", ""}, {"xxh64", "0123456789abcdef"}}}); }},
      {"predict on a gap-less non-object", &good, [&](J& j) { w(j)["predict"] = 3; }},
      {"empty frame of a plain tensor", &v1, [](J& j) { j["tensors"][0]["frames"][0]["size"] = 0; }},
      {"empty frame, prediction removed", &good, [&](J& j) { w(j).erase("predict"); }},
  };
  for (const auto& [what, base, edit] : edits) {
    write_all(p("e.tzip"), with_header(*base, edit));
    try {
      tc::Reader r(p("e.tzip"), 1);
      r.verify("", tc::ReadOptions{});
      ADD_FAILURE() << what << ": accepted";
    } catch (const tc::Error& e) {
      EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("header"), std::string::npos) << what << ": " << e.what();
    }
  }
  // Checks that need the referenced file happen when the prediction is used:
  // a cast whose source is not in the reference, a delta whose reference
  // tensor has another shape.
  write_st(p("r.safetensors"), {{"m", "F32", "[64,64]", m}, {"v", "F32", "[4096]", normal_f32(4096, 1.f, 42)}});
  tc::compress_file(p("r.safetensors"), p("r.tzip"), plain);
  write_st(p("x.safetensors"), {{"w", "BF16", "[64,64]", cast_of(m, tp::kCastBF16)}});
  tc::compress_checkpoint({p("x.safetensors"), p("r.safetensors")}, {p("x.tzip"), p("r2.tzip")}, tc::WriteOptions{});
  const Bytes x = read_all(p("x.tzip"));
  ASSERT_EQ(tc::Reader(p("x.tzip")).references().size(), 1u);
  for (const char* src : {"nope", "v"}) {
    write_all(p("e.tzip"), with_header(x, [&](J& j) { j["tensors"][0]["predict"]["source"] = src; }));
    tc::Reader r(p("e.tzip"), 1);
    try {
      r.read_tensor("w");
      ADD_FAILURE() << src << ": accepted";
    } catch (const tc::Error& e) {
      EXPECT_EQ(e.kind(), tc::ErrorKind::kBadInput) << e.what();
      EXPECT_NE(std::string(e.what()).find("r2.tzip"), std::string::npos) << e.what();
    }
  }
}

// ---- the real checkpoint pair ----------------------------------------------

TEST_F(Predict, FixtureStep200ToStep400AndASyntheticThird) {
  const std::string fx = TZ_SHARED_FIXTURES_DIR;
  const std::string m2 = fx + "/gpt-small-step200-model-bf16.safetensors", o2 = fx + "/gpt-small-step200-optim-fp32.safetensors";
  const std::string m4 = fx + "/gpt-small-step400-model-bf16.safetensors", o4 = fx + "/gpt-small-step400-optim-fp32.safetensors";
  if (!exists(m2) || !exists(o4)) GTEST_SKIP() << "fixtures not present in " << fx;
  for (const char* d : {"s200", "s400", "s400d", "s600"}) mkdir(p(d).c_str(), 0755);
  tc::WriteOptions o;
  tc::compress_checkpoint({m2, o2}, {p("s200/model.tzip"), p("s200/optim.tzip")}, o);
  const tc::PassStats alone = tc::compress_checkpoint({m4, o4}, {p("s400/model.tzip"), p("s400/optim.tzip")}, o);
  const tc::PassStats delta = tc::compress_checkpoint({m4, o4}, {p("s400d/model.tzip"), p("s400d/optim.tzip")}, o,
                                                      {p("s200/model.tzip"), p("s200/optim.tzip")});
  tc::WriteOptions plain = o;
  plain.predict = false;
  mkdir(p("plain").c_str(), 0755);
  const tc::PassStats base = tc::compress_checkpoint({m4, o4}, {p("plain/model.tzip"), p("plain/optim.tzip")}, plain);
  // Every BF16 weight is an exact RNE cast of its master (fixture README).
  tc::Reader mr(p("s400/model.tzip"));
  for (const auto& t : mr.tensors()) {
    EXPECT_EQ(t.predict.kind, tc::PredictKind::kCast) << t.name;
    EXPECT_EQ(t.predict.source, "master." + t.name);
  }
  tc::Reader od(p("s400d/optim.tzip"));
  size_t n_delta = 0;
  for (const auto& t : od.tensors()) n_delta += t.predict.kind == tc::PredictKind::kDelta;
  EXPECT_GT(n_delta, 0u);
  EXPECT_LT(alone.file_bytes, base.file_bytes * 90 / 100);  // model file ~free: 1.25x -> ~1.42x
  EXPECT_LT(delta.file_bytes, alone.file_bytes);
  roundtrip(p("s400/model.tzip"), m4);
  roundtrip(p("s400/optim.tzip"), o4);
  roundtrip(p("s400d/model.tzip"), m4);
  roundtrip(p("s400d/optim.tzip"), o4);
  // A synthetic third checkpoint: step400 with a few master values nudged
  // and the BF16 weights re-derived, coded against s400d (chain 600->400->200).
  const tc::SafetensorsInfo st = tc::read_safetensors_info(o4);
  Bytes optim = read_all(o4);
  for (const auto& t : st.tensors)
    if (t.name.rfind("master.", 0) == 0)
      for (uint64_t i = 0; i < t.raw_size(); i += 4 * 97) optim[st.data_start + t.data_begin + i + 1] ^= 0x10;
  write_all(p("o6.safetensors"), optim);
  const tc::SafetensorsInfo ms = tc::read_safetensors_info(m4);
  Bytes model = read_all(m4);
  for (const auto& t : ms.tensors) {
    const auto& s = st.tensors[(size_t)std::distance(
        st.tensors.begin(), std::find_if(st.tensors.begin(), st.tensors.end(),
                                         [&](const tc::TensorEntry& e) { return e.name == "master." + t.name; }))];
    tp::cast_xor(optim.data() + st.data_start + s.data_begin, model.data() + ms.data_start + t.data_begin,
                 t.raw_size() / 2, tp::kCastBF16);  // residual vs new cast ...
    Bytes zero(t.raw_size(), 0);
    // ... replaced by the exact cast: value = cast(master6).
    std::memcpy(model.data() + ms.data_start + t.data_begin, zero.data(), zero.size());
    tp::cast_xor(optim.data() + st.data_start + s.data_begin, model.data() + ms.data_start + t.data_begin,
                 t.raw_size() / 2, tp::kCastBF16);
  }
  write_all(p("m6.safetensors"), model);
  tc::compress_checkpoint({p("m6.safetensors"), p("o6.safetensors")}, {p("s600/model.tzip"), p("s600/optim.tzip")}, o,
                          {p("s400d/model.tzip"), p("s400d/optim.tzip")});
  roundtrip(p("s600/model.tzip"), p("m6.safetensors"));
  roundtrip(p("s600/optim.tzip"), p("o6.safetensors"));
  tc::Reader o6(p("s600/optim.tzip"));
  EXPECT_EQ(entry(o6, "master.tok.weight").predict.kind, tc::PredictKind::kDelta);
}
