// ggk_cond: the engine's own text conditioning (ggk 0.9.7), without a diffusion model.
//
// It does, for the text encoder only, what the engine's init (gk-diffuser.cpp) does before a
// generation, in the same order, with the engine's own classes: the tokenizer pack
// (gk-diffuser.cpp:1033-1037), ModelManager + ModelLoader with the --llm / --llm_vision /
// --llm-adapter prefixes (:1039-1043, 1144-1181), convert_tensors_name (:1224), the Qwen3.5
// vocabulary from the bridge adapter GGUF (:1236-1282), the embedded tokenizer_json of the
// Ming adapter (:1287-1362), the conditioner class and arguments the engine picks for the
// model version (:1448-1900), its ignore list (:2328-2384), registration on the CPU params
// backend, validation and the eager load (:2384-2396); then, per prompt, get_learned_condition
// with the same ConditionerParams fields the text-to-image path sets (:6181-6202). The model
// version, which the engine reads from the DiT's tensor names, is given on the command line.
//
//   ggk_cond --version NAME --llm S.gguf [--adapter A.gguf] [--vision V.gguf] [--threads N] < prompts.jsonl
// (without --adapter, --llm is a teacher the conditioner runs itself)
//
// stdin: one JSON object a line {"text": "...", "dump": DIR, "images": [{"path", "width", "height",
// "channels"}] (optional: raw 8-bit pixels, the references, of 1, 3 or 4 channels; the conditioner gets
// them as the pipeline hands them over, in the channels it keeps for the version, gk-diffuser.cpp:3731-3733,
// 5872-5893, 5984-5987, 6185-6193)}; SD_DUMP_COND=DIR is set around
// the call, so the conditioner writes its own dumps there (qwen_hidden.bin, adapter_out.bin,
// tokens.txt or t5_ids.txt, ...), and this driver adds cond.bin (c_crossattn, f32) and
// cond_shape.txt. stdout: one JSON object a line {"ok": true, "shape": [...]} or
// {"error": "..."}.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <unistd.h>

#include "conditioning/conditioner.hpp"
#include "core/util.h"
#include "ggml-cpu.h"
#include "json.hpp"
#include "model_manager.h"
#include "model_io/gguf_io.h"
#include "tokenizers/hf_tokenizer_json.h"
#include "tokenizers/vocab_provider.h"

using json = nlohmann::json;

// the model versions of the packs' DiTs (model.h; the engine reads the version from the DiT's
// tensor names, which this driver never loads)
static SDVersion version_named(const std::string& name) {
    static const std::pair<const char*, SDVersion> table[] = {
        {"llada_image", VERSION_LLADA_IMAGE}, {"mage_flow", VERSION_MAGE_FLOW},
        {"qwen_image_2_1", VERSION_QWEN_IMAGE_2_1}, {"pixart", VERSION_PIXART}, {"chroma", VERSION_FLUX},
        {"flux3", VERSION_FLUX3}, {"ming_image", VERSION_MING_IMAGE}, {"moss_image", VERSION_MOSS_IMAGE},
        {"z_image", VERSION_Z_IMAGE}, {"krea2", VERSION_KREA2}, {"iris", VERSION_IRIS},
    };
    for (const auto& [n, v] : table) {
        if (name == n) {
            return v;
        }
    }
    fprintf(stderr, "ggk_cond: unknown --version '%s'\n", name.c_str());
    exit(2);
}

// gk-diffuser.cpp:3731-3733 (get_image_channels): the channels the pipeline hands the conditioner a
// reference in, for the model version
static int image_channels(SDVersion version) {
    return version == VERSION_QWEN_IMAGE_LAYERED || version == VERSION_QWEN_IMAGE_2_1 || sd_version_is_ming_image(version) ? 4 : 3;
}

// gk-diffuser.cpp:5872-5893: a reference of `ch` 8-bit channels in the channels the pipeline keeps: an opaque
// alpha added (grey: repeated to RGB first), or the alpha sliced off
static std::vector<uint8_t> pipeline_channels(const std::vector<uint8_t>& in, size_t pixels, int ch, int keep) {
    if (ch == keep) {
        return in;
    }
    if (!((keep == 4 && (ch == 3 || ch == 1)) || (keep == 3 && ch >= 3))) {
        fprintf(stderr, "ggk_cond: cannot convert a reference from %d to %d channels\n", ch, keep);
        exit(1);
    }
    std::vector<uint8_t> out(pixels * keep);
    for (size_t i = 0; i < pixels; i++) {
        for (int c = 0; c < keep; c++) {
            out[i * keep + c] = c == 3 ? 255 : in[i * ch + (ch == 1 ? 0 : c)];
        }
    }
    return out;
}

// gk-diffuser.cpp:1289-1315 (read_embedded_json): tokenizer.json bytes stored one per element
static bool embedded_json(ModelLoader& loader, const String2TensorStorage& tsm, const std::string& name,
                          std::string& out) {
    const TensorStorage& storage = tsm.at(name);
    std::string raw;
    if (!loader.read_tensor_bytes(name, raw)) {
        return false;
    }
    if (storage.type == GGML_TYPE_F16) {
        out.resize(raw.size() / 2);
        const ggml_fp16_t* src = reinterpret_cast<const ggml_fp16_t*>(raw.data());
        for (size_t i = 0; i < out.size(); i++) {
            out[i] = static_cast<char>(static_cast<unsigned char>(std::lround(ggml_fp16_to_fp32(src[i]))));
        }
    } else if (storage.type == GGML_TYPE_F32) {
        out.resize(raw.size() / 4);
        const float* src = reinterpret_cast<const float*>(raw.data());
        for (size_t i = 0; i < out.size(); i++) {
            out[i] = static_cast<char>(static_cast<unsigned char>(std::lround(src[i])));
        }
    } else {
        out = std::move(raw);
    }
    while (!out.empty() && out.back() == '\0') {
        out.pop_back();
    }
    return true;
}

// every engine log line: to stderr (warnings and errors, or all with GGK_COND_VERBOSE=1), and the
// lines of the prompt being conditioned into its JSON answer ("log"), which holds the token ids
// the conditioners print at debug level
static std::vector<std::string> prompt_log;
static void on_log(sd_log_level_t level, const char* text, void*) {
    if (level >= SD_LOG_WARN || getenv("GGK_COND_VERBOSE") != nullptr) {
        fputs(text, stderr);
    }
    std::string line(text);
    while (!line.empty() && line.back() == '\n') {
        line.pop_back();
    }
    prompt_log.push_back(line);
}

static void write_file(const std::string& path, const void* data, size_t bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    if (f == nullptr) {
        fprintf(stderr, "ggk_cond: cannot write %s\n", path.c_str());
        exit(1);
    }
    fwrite(data, 1, bytes, f);
    fclose(f);
}

int main(int argc, char** argv) {
    std::string version_name, llm, adapter, vision;
    int threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--version") version_name = argv[i + 1];
        else if (a == "--llm") llm = argv[i + 1];
        else if (a == "--adapter") adapter = argv[i + 1];
        else if (a == "--vision") vision = argv[i + 1];
        else if (a == "--threads") threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "ggk_cond: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    if (version_name.empty() || llm.empty()) {
        fprintf(stderr, "usage: ggk_cond --version NAME --llm S.gguf [--adapter A.gguf] [--vision V.gguf] < prompts.jsonl\n");
        return 2;
    }
    const SDVersion version = version_named(version_name);
    sd_set_log_callback(on_log, nullptr);
    // the engine's progress bars printf to stdout: the answers get the real stdout, the rest stderr
    FILE* answers = fdopen(dup(fileno(stdout)), "w");
    dup2(fileno(stderr), fileno(stdout));

    if (getenv("SD_TOKENIZER_PACK") != nullptr && strlen(getenv("SD_TOKENIZER_PACK")) > 0) {
        VocabProvider::instance().set_pack_dir(getenv("SD_TOKENIZER_PACK"));
    }
    auto model_manager = std::make_shared<ModelManager>();
    model_manager->set_n_threads(threads);
    model_manager->set_enable_mmap(true);
    ModelLoader& loader = model_manager->loader();
    // the files in the engine's order; the engine converts the names once, under the version it read from
    // the DiT (:1224): with no DiT here, the last file is loaded by init_from_file_and_convert_name, which sets
    // the version first (model_loader.cpp:304-313), so the Qwen3-VL / Qwen3.5 mmproj names convert as under
    // their versions (name_conversion.cpp:1449-1457). Without --adapter the conditioner runs the --llm model
    // itself, the teacher path (SD_DUMP_COND: llm_hidden.bin, conditioner.hpp:2843-2893).
    std::vector<std::pair<std::string, std::string>> files = {{llm, "text_encoders.llm."}};
    if (!vision.empty()) {
        files.emplace_back(vision, sd_version_is_llada_image(version)   ? "sigvq."
                                   : sd_version_is_ming_image(version) ? "text_encoders.llm."
                                                                        : "text_encoders.llm.visual.");
    }
    if (!adapter.empty()) {
        files.emplace_back(adapter, "text_encoders.llm_adapter.");
    }
    for (size_t i = 0; i < files.size(); i++) {
        const auto& [path, prefix] = files[i];
        const bool ok = i + 1 < files.size() ? loader.init_from_file(path, prefix)
                                             : loader.init_from_file_and_convert_name(path, prefix, version);
        if (!ok) {
            fprintf(stderr, "ggk_cond: loading %s from '%s' failed\n", prefix.c_str(), path.c_str());
            return 1;
        }
    }
    auto& tsm = loader.get_tensor_storage_map();

    const bool bridge_adapter = tsm.find("text_encoders.llm_adapter.adapter.slot_query") != tsm.end() &&
                                tsm.find("text_encoders.llm_adapter.adapter.cap_query") == tsm.end();
    if ((sd_version_is_moss_image(version) || (sd_version_is_flux3(version) && bridge_adapter)) &&
        !VocabProvider::instance().has_override("qwen35.vocab")) {
        // the student (llm) never carries the qwen35 vocabulary here: take it from the adapter
        std::vector<std::string> tokens, merges;
        std::string pre;
        if (!adapter.empty() && read_gguf_tokenizer(adapter, tokens, merges, &pre) && !merges.empty() && pre == "qwen35") {
            VocabProvider::instance().set_override("qwen35.vocab", Qwen35Tokenizer::vocab_json_from_tokens(tokens));
            VocabProvider::instance().set_override("qwen35.merges", Qwen35Tokenizer::merges_from_list(merges));
        }
    }
    std::string tj_tensor;
    if (tsm.find("text_encoders.llm.tokenizer_json") != tsm.end()) {
        tj_tensor = "text_encoders.llm.tokenizer_json";
    } else if (sd_version_is_ming_image(version) && tsm.find("text_encoders.llm_adapter.tokenizer_json") != tsm.end()) {
        tj_tensor = "text_encoders.llm_adapter.tokenizer_json";
    }
    if (!tj_tensor.empty() && sd_version_is_ming_image(version)) {
        std::string tj, merges, vocab_json;
        if (embedded_json(loader, tsm, tj_tensor, tj)) {
            if (hf_tokenizer_json_extract_merges(tj, merges)) {
                VocabProvider::instance().set_override("ling.merges", std::move(merges));
            }
            if (hf_tokenizer_json_extract_vocab(tj, vocab_json)) {
                VocabProvider::instance().set_override("ling.vocab", std::move(vocab_json));
            }
        }
    }

    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, threads);
    std::shared_ptr<Conditioner> cond;
    if (sd_version_is_pixart(version)) {
        cond = std::make_shared<PixArtT5Embedder>(backend, tsm, 120, model_manager);
    } else if (sd_version_is_flux(version)) {     // Chroma: the engine's defaults (no T5 mask, pad 1)
        cond = std::make_shared<T5CLIPEmbedder>(backend, tsm, false, 1, false, model_manager);
    } else if (sd_version_is_ming_image(version) && MingImageAdapterEmbedder::present(tsm)) {
        cond = std::make_shared<MingImageAdapterEmbedder>(backend, tsm, model_manager);
    } else if ((sd_version_is_moss_image(version) || sd_version_is_flux3(version)) &&
               Qwen35BridgeEmbedder::present(tsm)) {
        cond = std::make_shared<Qwen35BridgeEmbedder>(backend, tsm, version, model_manager);
    } else {
        bool enable_vision = false;      // the versions whose init looks for a vision tower (:1553-1560, 1678-1684)
        if (sd_version_is_mage_flow(version) || version == VERSION_QWEN_IMAGE_2_1) {
            for (const auto& [name, _] : tsm) {
                if (starts_with(name, "text_encoders.llm.visual.")) {
                    enable_vision = true;
                    break;
                }
            }
        }
        cond = std::make_shared<LLMEmbedder>(backend, tsm, version, "", enable_vision, model_manager);
    }
    cond->set_flash_attention_enabled(false);

    std::set<std::string> ignore;
    if (sd_version_is_ming_image(version)) {
        ignore.insert("text_encoders.llm.tokenizer_json");
        ignore.insert("text_encoders.llm_adapter.tokenizer_json");
        ignore.insert("text_encoders.llm.thinker.lm_head.");
    }
    std::map<std::string, ggml_tensor*> params;
    cond->get_param_tensors(params);
    if (!model_manager->register_param_tensors("Conditioner model", std::move(params),
                                               ModelManager::ResidencyMode::ParamBackend, backend, backend)) {
        fprintf(stderr, "ggk_cond: registering the conditioner's params failed\n");
        return 1;
    }
    model_manager->set_common_ignore_tensors(ignore);
    if (!model_manager->validate_registered_tensors() || !model_manager->load_all_params_eagerly()) {
        fprintf(stderr, "ggk_cond: the model files do not validate or load\n");
        return 1;
    }

    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) {
            continue;
        }
        json item = json::parse(line);
        const std::string dump = item.at("dump").get<std::string>();
        setenv("SD_DUMP_COND", dump.c_str(), 1);
        prompt_log.clear();
        // references: raw 8-bit pixels, row-major height × width × channels, in the channels the pipeline
        // keeps for the version (get_image_channels), made a tensor as the pipeline makes it (util.cpp:741)
        std::vector<sd::Tensor<float>> refs;
        std::vector<std::vector<uint8_t>> ref_bytes;
        for (const auto& ref : item.value("images", json::array())) {
            const std::string path = ref.at("path").get<std::string>();
            const int w = ref.at("width").get<int>(), h = ref.at("height").get<int>(), ch = ref.at("channels").get<int>();
            FILE* f = fopen(path.c_str(), "rb");
            ref_bytes.emplace_back(static_cast<size_t>(w) * h * ch);
            if (f == nullptr || fread(ref_bytes.back().data(), 1, ref_bytes.back().size(), f) != ref_bytes.back().size()) {
                fprintf(stderr, "ggk_cond: cannot read %d x %d x %d pixels from %s\n", w, h, ch, path.c_str());
                return 1;
            }
            fclose(f);
            const int keep   = image_channels(version);
            ref_bytes.back() = pipeline_channels(ref_bytes.back(), static_cast<size_t>(w) * h, ch, keep);
            sd_image_t image = {static_cast<uint32_t>(w), static_cast<uint32_t>(h), static_cast<uint32_t>(keep),
                                ref_bytes.back().data()};
            refs.push_back(sd_image_to_tensor(image));
        }
        ConditionerParams p;
        p.ref_images      = refs.empty() ? nullptr : &refs;
        p.text            = item.at("text").get<std::string>();
        p.width           = item.value("width", 1024);
        p.height          = item.value("height", 1024);
        p.zero_out_masked = false;
        SDCondition c     = cond->get_learned_condition(threads, p);
        cond->runner_done();
        unsetenv("SD_DUMP_COND");
        json out;
        if (c.c_crossattn.empty()) {
            out["error"] = "empty c_crossattn";
        } else {
            write_file(dump + "/cond.bin", c.c_crossattn.data(), sizeof(float) * static_cast<size_t>(c.c_crossattn.numel()));
            out["ok"]    = true;
            out["shape"] = c.c_crossattn.shape();
        }
        out["log"] = prompt_log;
        fprintf(answers, "%s\n", out.dump().c_str());
        fflush(answers);
    }
    // leave without the destructors: the runners' contexts and the ModelManager's storage blocks
    // point at each other, and the engine never tears them down in this order either
    fflush(answers);
    fflush(stdout);
    std::_Exit(0);
}
